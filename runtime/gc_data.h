// gc_data.h — host-side readers for .npy (v1-v3, C order, little endian) and uncompressed IDX files.
// Every header field and the exact byte count are validated; errors name the file and the byte offset.
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

static int gc_read_file(const char* path, unsigned char** out, size_t* size) {
    *out = NULL;
    *size = 0;
    FILE* f = fopen(path, "rb");
    if (!f) return gc_fail(GC_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fileno(f), &info) != 0 || !S_ISREG(info.st_mode)) {
        fclose(f);
        return gc_fail(GC_ERR_IO, "%s: not a regular file", path);
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

// count *= d, refusing element counts past 2^40 (a terabyte of uint8: no dataset this reader is for).
static int gc_grow_count(int64_t* count, int64_t d, const char* path) {
    if (d < 0 || (d > 0 && *count > ((int64_t)1 << 40) / d))
        return gc_fail(GC_ERR_FORMAT, "%s: the header's shape has more than 2^40 elements (corrupt header?)", path);
    *count *= d;
    return GC_OK;
}

// Find `'key':` in a .npy header dict and return a pointer just past the colon (NULL if absent).
static const char* gc_npy_field(const char* header, const char* key) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "'%s':", key);
    const char* p = strstr(header, pattern);
    if (!p) return NULL;
    p += strlen(pattern);
    while (*p == ' ') p++;
    return p;
}

static int gc_parse_npy(const char* path, unsigned char* buf, size_t size, gc_array* out) {
    if (size < 10) return gc_fail(GC_ERR_FORMAT, "%s: %zu bytes is too short for a .npy header", path, size);
    int major = buf[6];
    size_t header_len, start;
    if (major == 1) { header_len = buf[8] | (buf[9] << 8); start = 10; }
    else if (major == 2 || major == 3) {
        if (size < 12) return gc_fail(GC_ERR_FORMAT, "%s: truncated .npy header", path);
        header_len = buf[8] | (buf[9] << 8) | ((size_t)buf[10] << 16) | ((size_t)buf[11] << 24);
        start = 12;
    } else return gc_fail(GC_ERR_FORMAT, "%s: byte 6: unsupported .npy format version %d", path, major);
    if (start + header_len > size)
        return gc_fail(GC_ERR_FORMAT, "%s: header of %zu bytes runs past the end of the file (%zu bytes)",
                       path, header_len, size);
    char header[4096];
    if (header_len >= sizeof header) return gc_fail(GC_ERR_FORMAT, "%s: .npy header too long (%zu)", path, header_len);
    memcpy(header, buf + start, header_len);
    header[header_len] = 0;

    const char* descr = gc_npy_field(header, "descr");
    if (!descr || *descr != '\'') return gc_fail(GC_ERR_FORMAT, "%s: .npy header has no 'descr'", path);
    static const char* descrs[] = {"'|u1'", "'<i4'", "'<f4'", "'<i8'", "'<f8'"};
    out->dtype = -1;
    for (int i = 0; i < 5; i++)
        if (strncmp(descr, descrs[i], strlen(descrs[i])) == 0) out->dtype = i;
    if (out->dtype < 0) {
        char d[16] = {0};
        strncpy(d, descr, 8);
        return gc_fail(GC_ERR_FORMAT, "%s: unsupported dtype %s (need uint8, int32, int64, float32 or float64, "
                       "little endian)", path, d);
    }
    const char* fortran = gc_npy_field(header, "fortran_order");
    if (!fortran || strncmp(fortran, "False", 5) != 0)
        return gc_fail(GC_ERR_FORMAT, "%s: only C-order arrays are supported (fortran_order must be False)", path);
    const char* shape = gc_npy_field(header, "shape");
    if (!shape || *shape != '(') return gc_fail(GC_ERR_FORMAT, "%s: .npy header has no 'shape'", path);
    out->ndim = 0;
    out->count = 1;
    const char* p = shape + 1;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ')') break;
        char* end;
        long long d = strtoll(p, &end, 10);
        if (end == p || d < 0 || out->ndim == 8)
            return gc_fail(GC_ERR_FORMAT, "%s: cannot parse shape %.40s", path, shape);
        GC_TRY(gc_grow_count(&out->count, d, path));
        out->dims[out->ndim++] = d;
        p = end;
    }
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

static int gc_file_exists(const char* path) {
    FILE* f = fopen(path, "rb");
    if (f) fclose(f);
    return f != NULL;
}
