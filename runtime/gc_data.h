// gc_data.h — host-side readers for .npy (v1-v3, C order, little endian) and uncompressed IDX files.
// Every header field and the exact byte count are validated; errors name the file and the byte offset.
#if GC_HOST   // the host part (gc_runtime.h)
#include <fcntl.h>
#include <sys/stat.h>

enum { GC_U8 = 0, GC_I32 = 1, GC_F32 = 2, GC_I64 = 3, GC_F64 = 4 };
static const char* gc_dtype_names[] = {"uint8", "int32", "float32", "int64", "float64"};
static const size_t gc_dtype_sizes[] = {1, 4, 4, 8, 8};

typedef struct {
    void* data;       // host memory owned by the array (free with gc_array_free)
    int dtype;        // GC_U8 ...
    int ndim;
    int64_t dims[8];
    int64_t count;    // number of elements
} gc_array;

static void gc_array_free(gc_array* a) { free(a->data); a->data = NULL; }

// Label i of an array of dtype GC_U8, GC_I32 or GC_I64.
static int64_t gc_label_value(int dtype, const void* data, int64_t i) {
    return dtype == GC_U8 ? ((const uint8_t*)data)[i] : dtype == GC_I32 ? ((const int32_t*)data)[i]
                                                                       : ((const int64_t*)data)[i];
}

// The index of the first of n labels outside [0, classes), its value in *value; -1 when all are inside. The
// trainer's splits (gc_load_split) and the ABI's label inputs (gc_copy_inputs) are checked by it.
static int64_t gc_bad_label(int dtype, const void* data, int64_t n, int64_t classes, int64_t* value) {
    for (int64_t i = 0; i < n; i++) {
        int64_t v = gc_label_value(dtype, data, i);
        if (v < 0 || v >= classes) { *value = v; return i; }
    }
    return -1;
}

// A regular file's bytes. Opened without blocking: opening a fifo to read waits for a writer (a fifo in a dataset
// file's or a checkpoint's place hung the trainer), and a regular file's reads ignore O_NONBLOCK.
static int gc_read_file(const char* path, unsigned char** out, size_t* size) {
    *out = NULL;
    *size = 0;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return gc_fail(GC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
        close(fd);
        return gc_fail(GC_ERR_IO, "%s: not a regular file", path);
    }
    FILE* f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        return gc_fail(GC_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    size_t n = (size_t)info.st_size;
    unsigned char* buf = (unsigned char*)malloc(n ? n : 1);
    if (!buf) { fclose(f); return gc_fail(GC_ERR_MEMORY, "%s: cannot allocate %zu bytes", path, n); }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) { free(buf); return gc_fail(GC_ERR_IO, "%s: short read (%zu of %zu bytes)", path, got, n); }
    *out = buf;
    *size = n;
    return GC_OK;
}

// A file's text as it may appear in a message: printable ASCII, anything else as '?'. dst holds n + 1.
static void gc_printable(char* dst, const char* src, int n) {
    for (int i = 0; i < n; i++) dst[i] = src[i] >= 32 && src[i] < 127 ? src[i] : '?';
    dst[n] = 0;
}

// count *= d, refusing element counts past 2^40 (a terabyte of uint8: no dataset this reader is for).
static int gc_grow_count(int64_t* count, int64_t d, const char* path) {
    if (d < 0 || (d > 0 && *count > ((int64_t)1 << 40) / d))
        return gc_fail(GC_ERR_FORMAT, "%s: the header's shape has more than 2^40 elements (corrupt header?)", path);
    *count *= d;
    return GC_OK;
}

// A .npy header is the text of a Python dict with exactly the keys 'descr', 'fortran_order' and 'shape', as
// numpy writes it (and reads it back with ast.literal_eval). This parser accepts that text, in any key order,
// and nothing else: a header numpy would refuse is refused here too.
typedef struct { const char* p; const char* end; const char* path; const char* start; } gc_header;

static int gc_header_fail(gc_header* h, const char* what) {
    return gc_fail(GC_ERR_FORMAT, "%s: .npy header byte %d: %s (the header must be the dict numpy writes)", h->path,
                   (int)(h->p - h->start), what);
}

static void gc_header_space(gc_header* h) {
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\t')) h->p++;
}

static int gc_header_accept(gc_header* h, char c) {
    gc_header_space(h);
    if (h->p < h->end && *h->p == c) { h->p++; return 1; }
    return 0;
}

// A quoted string ('...' or "...", no escapes): sets *s to its first character and *n to its length.
static int gc_header_string(gc_header* h, const char** s, int* n) {
    gc_header_space(h);
    char quote = h->p < h->end ? *h->p : 0;
    if (quote != '\'' && quote != '"') return gc_header_fail(h, "expected a quoted string");
    const char* close = (const char*)memchr(h->p + 1, quote, (size_t)(h->end - h->p - 1));
    if (!close || memchr(h->p + 1, '\\', (size_t)(close - h->p - 1))) return gc_header_fail(h, "bad string");
    *s = h->p + 1;
    *n = (int)(close - h->p - 1);
    h->p = close + 1;
    return GC_OK;
}

static int gc_header_is(const char* s, int n, const char* word) { return (int)strlen(word) == n && !memcmp(s, word, n); }

static int gc_header_shape(gc_header* h, gc_array* out) {
    if (!gc_header_accept(h, '(')) return gc_header_fail(h, "'shape' must be a tuple");
    out->ndim = 0;
    out->count = 1;
    int need_comma = 0;   // (n) is a number, not a tuple: one dimension needs its comma
    while (!gc_header_accept(h, ')')) {
        if (out->ndim && !gc_header_accept(h, ',')) return gc_header_fail(h, "expected ',' in 'shape'");
        if (gc_header_accept(h, ')')) { need_comma = 0; break; }
        gc_header_space(h);
        const char* digits = h->p;
        while (h->p < h->end && *h->p >= '0' && *h->p <= '9') h->p++;
        if (h->p == digits || h->p - digits > 15 || (*digits == '0' && h->p - digits > 1))
            return gc_header_fail(h, "a dimension of 'shape' is not a whole number");
        if (out->ndim == 8) return gc_header_fail(h, "more than 8 dimensions");
        GC_TRY(gc_grow_count(&out->count, strtoll(digits, NULL, 10), h->path));
        out->dims[out->ndim++] = strtoll(digits, NULL, 10);
        need_comma = out->ndim == 1;
    }
    if (need_comma) return gc_header_fail(h, "a 1-dimensional 'shape' needs a comma, as in (40,)");
    return GC_OK;
}

static int gc_header_parse(gc_header* h, gc_array* out) {
    static const char* descrs[] = {"|u1", "<i4", "<f4", "<i8", "<f8"};
    int seen = 0;   // bits: descr, fortran_order, shape
    if (!gc_header_accept(h, '{')) return gc_header_fail(h, "expected '{'");
    while (!gc_header_accept(h, '}')) {
        if (seen && !gc_header_accept(h, ',')) return gc_header_fail(h, "expected ',' or '}'");
        if (gc_header_accept(h, '}')) break;
        const char *key, *value;
        int key_n, value_n;
        GC_TRY(gc_header_string(h, &key, &key_n));
        int bit = gc_header_is(key, key_n, "descr") ? 1 : gc_header_is(key, key_n, "fortran_order") ? 2
                : gc_header_is(key, key_n, "shape") ? 4 : 0;
        if (!bit || (seen & bit)) {
            h->p = key - 1;
            return gc_header_fail(h, bit ? "repeated key" : "unexpected key");
        }
        if (!gc_header_accept(h, ':')) return gc_header_fail(h, "expected ':'");
        seen |= bit;
        if (bit == 1) {
            GC_TRY(gc_header_string(h, &value, &value_n));
            out->dtype = -1;
            for (int i = 0; i < 5; i++)
                if (gc_header_is(value, value_n, descrs[i])) out->dtype = i;
            if (out->dtype < 0) {
                char shown[17];
                gc_printable(shown, value, value_n < 16 ? value_n : 16);
                return gc_fail(GC_ERR_FORMAT, "%s: unsupported dtype '%s' (need uint8, int32, int64, float32 or "
                               "float64, little endian)", h->path, shown);
            }
        } else if (bit == 2) {
            gc_header_space(h);
            if (h->end - h->p >= 4 && !memcmp(h->p, "True", 4))
                return gc_fail(GC_ERR_FORMAT, "%s: only C-order arrays are supported (fortran_order must be False)",
                               h->path);
            if (h->end - h->p < 5 || memcmp(h->p, "False", 5)) return gc_header_fail(h, "expected True or False");
            h->p += 5;
        } else GC_TRY(gc_header_shape(h, out));
    }
    while (h->p < h->end && (*h->p == ' ' || *h->p == '\n')) h->p++;
    if (h->p != h->end) return gc_header_fail(h, "unexpected text after the dict");
    if (seen != 7) return gc_header_fail(h, "missing 'descr', 'fortran_order' or 'shape'");
    return GC_OK;
}

static int gc_parse_npy(const char* path, unsigned char* buf, size_t size, gc_array* out) {
    if (size < 10) return gc_fail(GC_ERR_FORMAT, "%s: %zu bytes is too short for a .npy header", path, size);
    int major = buf[6];
    size_t header_len, start;
    if (buf[7] != 0) return gc_fail(GC_ERR_FORMAT, "%s: byte 7: unsupported .npy format version %d.%d", path, major, buf[7]);
    if (major == 1) { header_len = buf[8] | (buf[9] << 8); start = 10; }
    else if (major == 2 || major == 3) {
        if (size < 12) return gc_fail(GC_ERR_FORMAT, "%s: truncated .npy header", path);
        header_len = buf[8] | (buf[9] << 8) | ((size_t)buf[10] << 16) | ((size_t)buf[11] << 24);
        start = 12;
    } else return gc_fail(GC_ERR_FORMAT, "%s: byte 6: unsupported .npy format version %d", path, major);
    if (header_len > size - start)
        return gc_fail(GC_ERR_FORMAT, "%s: header of %zu bytes runs past the end of the file (%zu bytes)",
                       path, header_len, size);
    gc_header h = {(const char*)buf + start, (const char*)buf + start + header_len, path, (const char*)buf + start};
    GC_TRY(gc_header_parse(&h, out));
    size_t data_start = start + header_len;
    size_t want = (size_t)out->count * gc_dtype_sizes[out->dtype];
    if (size - data_start != want)
        return gc_fail(GC_ERR_FORMAT, "%s: expected %zu data bytes after the header at byte %zu, found %zu "
                       "(truncated or corrupt)", path, want, data_start, size - data_start);
    out->data = malloc(want ? want : 1);
    if (!out->data) return gc_fail(GC_ERR_MEMORY, "%s: cannot allocate %zu bytes", path, want);
    memcpy(out->data, buf + data_start, want);
    return GC_OK;
}

static int gc_parse_idx(const char* path, unsigned char* buf, size_t size, gc_array* out) {
    if (size < 4) return gc_fail(GC_ERR_FORMAT, "%s: too short for an IDX header", path);
    if (buf[2] != 0x08)
        return gc_fail(GC_ERR_FORMAT, "%s: byte 2: IDX element type 0x%02x is not supported (only 0x08, unsigned byte)",
                       path, buf[2]);
    int ndim = buf[3];
    if (ndim < 1 || ndim > 8) return gc_fail(GC_ERR_FORMAT, "%s: byte 3: bad IDX dimension count %d", path, ndim);
    size_t start = 4 + 4 * (size_t)ndim;
    if (size < start) return gc_fail(GC_ERR_FORMAT, "%s: truncated IDX header", path);
    out->dtype = GC_U8;
    out->ndim = ndim;
    out->count = 1;
    for (int i = 0; i < ndim; i++) {
        const unsigned char* d = buf + 4 + 4 * i;
        out->dims[i] = ((int64_t)d[0] << 24) | ((int64_t)d[1] << 16) | ((int64_t)d[2] << 8) | d[3];
        GC_TRY(gc_grow_count(&out->count, out->dims[i], path));
    }
    if (size - start != (size_t)out->count)
        return gc_fail(GC_ERR_FORMAT, "%s: expected %lld data bytes after the header at byte %zu, found %zu",
                       path, (long long)out->count, start, size - start);
    out->data = malloc(out->count ? out->count : 1);
    if (!out->data) return gc_fail(GC_ERR_MEMORY, "%s: cannot allocate %lld bytes", path, (long long)out->count);
    memcpy(out->data, buf + start, out->count);
    return GC_OK;
}

// Read a .npy or an uncompressed IDX file, told apart by their magic bytes.
static int gc_read_array(const char* path, gc_array* out) {
    memset(out, 0, sizeof *out);
    unsigned char* buf;
    size_t size;
    GC_TRY(gc_read_file(path, &buf, &size));
    int rc;
    if (size >= 6 && memcmp(buf, "\x93NUMPY", 6) == 0) rc = gc_parse_npy(path, buf, size, out);
    else if (size >= 4 && buf[0] == 0 && buf[1] == 0) rc = gc_parse_idx(path, buf, size, out);
    else if (size >= 2 && buf[0] == 0x1f && buf[1] == 0x8b)
        rc = gc_fail(GC_ERR_FORMAT, "%s: gzip-compressed; decompress it or convert it with `gcompile data`", path);
    else rc = gc_fail(GC_ERR_FORMAT, "%s: bytes 0-5: neither a .npy file nor an IDX file", path);
    free(buf);
    return rc;
}

// Whether something is at path (gc_read_file says what, if it is not a regular file): stat, not an open, which a
// fifo would block.
static int gc_file_exists(const char* path) {
    struct stat info;
    return stat(path, &info) == 0;
}
#endif   // GC_HOST
