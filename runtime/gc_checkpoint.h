// gc_checkpoint.h — the checkpoint format (the same as gcompile/checkpoint.py reads and writes).
//
//   magic "GCKPT\0\0\0" | u32 version | u32 tensor count | u64 layout hash
//   u64 step | u64 epoch | u64 epoch step | u64 seed | u64 shuffle | u64 batch | f64 loss sum  (the trainer's
//   position; version 2, still read, has no batch)
//   per tensor: u16 name length | name | u8 dtype | u8 ndim | u64 dims[ndim] | u64 byte count | bytes
//   u32 CRC-32 (zlib's polynomial) of everything before it.   (all integers little endian)
//
// The tensors are every variable of the program: parameters, optimizer state, the learning rate, the step
// counter and the numerical guard's state. The header says where the trainer stands: `step` steps run in
// all, `epoch` epochs finished, `epoch_step` steps into the next one, the data order's seed and whether it
// shuffles (an epoch's order is a function of seed and epoch alone), the batch size of the program that
// wrote it (the layout hash does not tell programs of other batch sizes apart, whose epochs are other steps)
// and the sum of the losses of the epoch so far — so a resumed run continues exactly where the saved one was.
//
// Written atomically: a temporary file in the same directory, fsync, rename — an existing checkpoint is
// never replaced by a partial one, nor by one holding a non-finite float. Loading checks size, checksum, magic,
// version and the layout hash first, and only then writes into the model, so a bad file leaves it unchanged.
#if GC_HOST   // the host part (gc_runtime.h)
#include <fcntl.h>
#include <limits.h>
#include <signal.h>

#define GC_CKPT_VERSION 3u   // version 2: the same without the batch
static const char GC_CKPT_MAGIC[8] = {'G', 'C', 'K', 'P', 'T', 0, 0, 0};

typedef struct {
    const char* name;
    int dtype;
    int ndim;
    int64_t dims[8];  // at most 8 dimensions (graph.MAX_NDIM)
    size_t offset;   // in the arena
    size_t nbytes;
    int64_t classes;   // an input of softmax_cross_entropy's labels: its values are in [0, classes); else 0
    int model;         // a variable of the model (the evaluation step reads it, or it is trained): what --load
                       // takes from a checkpoint; the others (optimizer state, step counter, guard) start anew
} gc_tensor_info;

typedef struct {
    uint64_t step, epoch, epoch_step, seed, shuffle;
    double loss_sum;
    uint64_t batch;   // the batch size the position (epoch, epoch_step) counts in (0: not recorded)
} gc_train_state;

struct gc_crc32_table {
    uint32_t v[256];
    gc_crc32_table() {
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            v[i] = c;
        }
    }
};
static uint32_t gc_crc32(const unsigned char* p, size_t n) {
    // made once, by the first caller, before any caller reads it (a static local's initialization is thread-safe;
    // a table filled on first use behind `if (!table[1])` let a second thread read entries not yet written)
    static const gc_crc32_table table;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = table.v[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

typedef struct { unsigned char* p; size_t n, cap; } gc_buffer;

static int gc_buf_put(gc_buffer* b, const void* src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n) cap *= 2;
        unsigned char* p = (unsigned char*)realloc(b->p, cap);
        if (!p) return gc_fail(GC_ERR_MEMORY, "cannot grow the checkpoint buffer to %zu bytes", cap);
        b->p = p; b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
    return GC_OK;
}

// The file a checkpoint at `path` is written to (into `dest`, n bytes): path itself, or the file a chain of
// symbolic links there ends at (the rename replaces that file, not a link), followed one link at a time (at
// most 40) so that a chain ending nowhere yet still names its last file. Refused: an empty path, a loop of
// links, a path too long for `dest`, and anything but a regular file at the end (a folder; a device, fifo
// or socket, which the rename would replace with a plain file).
static int gc_save_target(const char* path, char* dest, size_t n) {
    if (!*path) return gc_fail(GC_ERR_ARG, "the checkpoint path is empty");
    if (snprintf(dest, n, "%s", path) >= (int)n) return gc_fail(GC_ERR_ARG, "checkpoint path too long: %s", path);
    struct stat st;
    for (int hops = 0; lstat(dest, &st) == 0 && S_ISLNK(st.st_mode); hops++) {
        char target[PATH_MAX], next[PATH_MAX];
        if (hops == 40) return gc_fail(GC_ERR_ARG, "%s: a loop of symbolic links (or more than 40 of them)", path);
        ssize_t len = readlink(dest, target, sizeof target - 1);
        if (len < 0) return gc_fail(GC_ERR_IO, "%s: cannot read the symbolic link: %s", dest, strerror(errno));
        target[len] = 0;
        const char* slash = strrchr(dest, '/');   // a relative target is relative to the link's folder
        int w = target[0] == '/' || !slash ? snprintf(next, sizeof next, "%s", target)
                                           : snprintf(next, sizeof next, "%.*s/%s", (int)(slash - dest), dest, target);
        if (w >= (int)sizeof next || snprintf(dest, n, "%s", next) >= (int)n)
            return gc_fail(GC_ERR_ARG, "%s: the file its symbolic links name has too long a path", path);
    }
    if (stat(dest, &st) == 0 && !S_ISREG(st.st_mode))
        return gc_fail(GC_ERR_ARG, "%s: %s, not a regular file: a checkpoint is not written there", dest,
                       S_ISDIR(st.st_mode) ? "a folder" : "a device, fifo or socket");
    return GC_OK;
}

// The standalone binary's saves (gc_main sets gc_save_guard): SIGINT, SIGTERM and SIGHUP that arrive while one
// is being written remove its temporary file, then end the process as they would have. The library leaves
// signals alone: a host process (Python) sets its own handlers, from any thread, at any time.
static int gc_save_guard;
static char gc_saving[PATH_MAX + 32];
static volatile sig_atomic_t gc_saving_now;
static const int gc_save_signals[3] = {SIGINT, SIGTERM, SIGHUP};

static void gc_on_save_signal(int sig) {
    if (gc_saving_now) unlink(gc_saving);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int gc_is_default(const struct sigaction* a) { return !(a->sa_flags & SA_SIGINFO) && a->sa_handler == SIG_DFL; }

// On: the handler above in place of default ones (what was there goes into old); off: old's back, where the
// handler is still this one. The temporary file it removes is named by gc_saving_name.
static void gc_guard_save(int on, struct sigaction* old) {
    if (!gc_save_guard) return;
    gc_saving_now = 0;
    for (int i = 0; i < 3; i++) {
        if (on) {
            struct sigaction sa;
            memset(&sa, 0, sizeof sa);
            sigemptyset(&sa.sa_mask);
            sa.sa_handler = gc_on_save_signal;
            if (sigaction(gc_save_signals[i], NULL, &old[i]) != 0) {   // not known: left as it is
                memset(&old[i], 0, sizeof old[i]);
                old[i].sa_handler = SIG_IGN;
            }
            if (gc_is_default(&old[i])) sigaction(gc_save_signals[i], &sa, NULL);
        } else if (gc_is_default(&old[i])) {
            struct sigaction now;
            if (sigaction(gc_save_signals[i], NULL, &now) == 0 && !(now.sa_flags & SA_SIGINFO) &&
                now.sa_handler == gc_on_save_signal)
                sigaction(gc_save_signals[i], &old[i], NULL);
        }
    }
}

// The temporary file a signal during the save removes (never a name half copied: the handler reads it only
// once it is whole).
static void gc_saving_name(const char* tmp) {
    if (!gc_save_guard) return;
    gc_saving_now = 0;
    snprintf(gc_saving, sizeof gc_saving, "%s", tmp);
    gc_saving_now = 1;
}

// A new temporary file beside `dest` (`dest.tmp.XXXXXX`, a name of its own: saves of two threads or
// processes to one path must not write into each other's), open for writing (*fd), its name in tmp. Made
// as mkstemp makes its files (O_EXCL, another name on a clash) but with mode 0666, which the kernel reduces
// by the umask, as fopen would: mkstemp's 0600 would need the umask read back by setting it, and a umask set
// for a moment is the process's, which a save on another thread could then read as its own and restore.
static int gc_temporary(const char* path, const char* dest, char* tmp, size_t n, int* fd) {
    static const char letters[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    static uint64_t calls;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t x = ((uint64_t)getpid() << 32) ^ (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20);
    for (int attempt = 0; attempt < 100; attempt++) {
        uint64_t z = gc_mix64(x + 0x9E3779B97F4A7C15ull * (__atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED) + 1));
        char suffix[7];
        for (int i = 0; i < 6; i++, z /= 62) suffix[i] = letters[z % 62];
        suffix[6] = 0;
        if (snprintf(tmp, n, "%s.tmp.%s", dest, suffix) >= (int)n)
            return gc_fail(GC_ERR_ARG, "checkpoint path too long: %s", dest);
        *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (*fd >= 0) return GC_OK;
        if (errno != EEXIST) break;
    }
    return gc_fail(GC_ERR_IO, "%s: a checkpoint cannot be written there: %s", path, strerror(errno));
}

// Whether a checkpoint can be written at `path` (the trainer's --save, before any training): its target is
// a regular file or none (gc_save_target), and a temporary file can be made in that folder.
static int gc_check_save_path(const char* path) {
    char dest[PATH_MAX], tmp[PATH_MAX + 32];
    int fd;
    GC_TRY(gc_save_target(path, dest, sizeof dest));
    GC_TRY(gc_temporary(path, dest, tmp, sizeof tmp, &fd));
    close(fd);
    unlink(tmp);
    return GC_OK;
}

static int gc_write_atomic(const char* path, const void* data, size_t n) {
    char dest[PATH_MAX], tmp[PATH_MAX + 32];
    int fd;
    GC_TRY(gc_save_target(path, dest, sizeof dest));
    struct sigaction old[3];
    gc_guard_save(1, old);   // from before the file exists until it is renamed or removed
    int rc = gc_temporary(path, dest, tmp, sizeof tmp, &fd);
    if (rc != GC_OK) {
        gc_guard_save(0, old);
        return rc;
    }
    gc_saving_name(tmp);
    FILE* f = fdopen(fd, "wb");
    if (!f) {
        int err = errno;
        close(fd);
        remove(tmp);
        gc_guard_save(0, old);
        return gc_fail(GC_ERR_IO, "%s: cannot write checkpoint: %s", path, strerror(err));
    }
    int ok = fwrite(data, 1, n, f) == n && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int err = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) { ok = 0; err = errno; }
    if (ok && rename(tmp, dest) != 0) { ok = 0; err = errno; }
    if (!ok) {
        remove(tmp);
        gc_guard_save(0, old);
        return gc_fail(GC_ERR_IO, "%s: cannot write checkpoint: %s (existing file left unchanged)", path, strerror(err));
    }
    gc_guard_save(0, old);
    return GC_OK;
}

// A checkpoint is a state to go back to: one with an inf or NaN in a float variable is not written.
static int gc_check_finite(const char* path, const gc_tensor_info* t, const void* host) {
    size_t n = t->nbytes / gc_dtype_sizes[t->dtype];
    for (size_t i = 0; i < n; i++) {
        double v = t->dtype == GC_F32 ? ((const float*)host)[i] : t->dtype == GC_F64 ? ((const double*)host)[i] : 0;
        if (!isfinite(v))
            return gc_fail(GC_ERR_NUMERIC, "%s: not saved: variable '%s' holds the non-finite value %g at element %zu",
                           path, t->name, v, i);
    }
    return GC_OK;
}

static int gc_checkpoint_save(const char* path, const gc_tensor_info* table, int n, uint64_t layout_hash,
                              const gc_train_state* st, const unsigned char* arena) {
    gc_buffer b = {0};
    uint32_t version = GC_CKPT_VERSION, count = (uint32_t)n;
    uint64_t head[7] = {layout_hash, st->step, st->epoch, st->epoch_step, st->seed, st->shuffle, st->batch};
    int rc = GC_OK;
    void* host = NULL;
    if ((rc = gc_buf_put(&b, GC_CKPT_MAGIC, 8)) || (rc = gc_buf_put(&b, &version, 4)) ||
        (rc = gc_buf_put(&b, &count, 4)) || (rc = gc_buf_put(&b, head, sizeof head)) ||
        (rc = gc_buf_put(&b, &st->loss_sum, 8))) goto done;
    for (int i = 0; i < n; i++) {
        const gc_tensor_info* t = &table[i];
        uint16_t len = (uint16_t)strlen(t->name);
        uint8_t dt = (uint8_t)t->dtype, nd = (uint8_t)t->ndim;
        uint64_t dims[8], nbytes = t->nbytes;
        for (int d = 0; d < t->ndim; d++) dims[d] = (uint64_t)t->dims[d];
        free(host);
        host = malloc(t->nbytes ? t->nbytes : 1);
        if (!host) { rc = gc_fail(GC_ERR_MEMORY, "cannot allocate %zu bytes", t->nbytes); goto done; }
        if ((rc = gc_copy_to_host(host, arena + t->offset, t->nbytes))) goto done;
        if ((rc = gc_check_finite(path, t, host))) goto done;
        if ((rc = gc_buf_put(&b, &len, 2)) || (rc = gc_buf_put(&b, t->name, len)) || (rc = gc_buf_put(&b, &dt, 1)) ||
            (rc = gc_buf_put(&b, &nd, 1)) || (rc = gc_buf_put(&b, dims, 8 * (size_t)t->ndim)) ||
            (rc = gc_buf_put(&b, &nbytes, 8)) || (rc = gc_buf_put(&b, host, t->nbytes))) goto done;
    }
    {
        uint32_t sum = gc_crc32(b.p, b.n);
        if ((rc = gc_buf_put(&b, &sum, 4))) goto done;
    }
    rc = gc_write_atomic(path, b.p, b.n);
done:
    free(host);
    free(b.p);
    return rc;
}

// Bounds-checked reads from a file image; `what` names the field in the error.
typedef struct { const unsigned char* p; size_t n, at; const char* path; } gc_reader;

static int gc_take(gc_reader* r, void* dst, size_t n, const char* what) {
    if (r->at + n > r->n)
        return gc_fail(GC_ERR_FORMAT, "%s: truncated at byte %zu while reading %s", r->path, r->at, what);
    memcpy(dst, r->p + r->at, n);
    r->at += n;
    return GC_OK;
}

// "float32 (784, 256)": a tensor's dtype code and dims, for messages.
static void gc_tensor_text(char* out, size_t size, unsigned dtype, const uint64_t* dims, int nd) {
    const int known = dtype < sizeof gc_dtype_names / sizeof *gc_dtype_names;
    int at = known ? snprintf(out, size, "%s (", gc_dtype_names[dtype]) : snprintf(out, size, "dtype %u (", dtype);
    for (int d = 0; d < nd && at > 0 && (size_t)at < size; d++)
        at += snprintf(out + at, size - at, d ? ", %llu" : "%llu", (unsigned long long)dims[d]);
    if (at > 0 && (size_t)at < size) snprintf(out + at, size - at, nd == 1 ? ",)" : ")");
}

// Check a checkpoint against the program's variable table; with `arena` load its variables, with `st` its
// position. With model_only (the trainer's --load) only the model is checked and loaded (table[i].model:
// what the evaluation reads, and every trained variable), matched by name, dtype and shape: the file may
// come from a build with other optimizer state (another optimizer, another layout hash), whose tensors
// are passed over. Nothing is written into the model unless every check passed.
static int gc_checkpoint_load(const char* path, const gc_tensor_info* table, int n, uint64_t layout_hash,
                              gc_train_state* st, unsigned char* arena, int model_only) {
    unsigned char* file;
    size_t size;
    GC_TRY(gc_read_file(path, &file, &size));
    int rc = GC_OK;
    const unsigned char** src = (const unsigned char**)calloc(n ? n : 1, sizeof *src);
    gc_reader r = {file, size >= 4 ? size - 4 : 0, 0, path};
    char magic[8];
    uint32_t version = 0, count = 0, stored_sum = 0;
    uint64_t head[7] = {0};
    double loss_sum;
    char other[112] = "";   // (declared before the first goto: C++ refuses a jump past an initialization)
    const char* sep = "";
    if (!src) { rc = gc_fail(GC_ERR_MEMORY, "out of host memory"); goto done; }
    if (size < 8 || memcmp(file, GC_CKPT_MAGIC, 8) != 0) {
        rc = gc_fail(GC_ERR_FORMAT, "%s: bytes 0-7: not a gcompile checkpoint", path);
        goto done;
    }
    if (size < 16) { rc = gc_fail(GC_ERR_FORMAT, "%s: %zu bytes is too short for a checkpoint", path, size); goto done; }
    memcpy(&version, file + 8, 4);
    memcpy(&stored_sum, file + size - 4, 4);
    if (gc_crc32(file, size - 4) != stored_sum) {
        rc = gc_fail(GC_ERR_FORMAT, "%s: checksum mismatch over its %zu bytes (corrupted or truncated file)", path, size);
        goto done;
    }
    if (version != GC_CKPT_VERSION && version != 2) {
        rc = gc_fail(GC_ERR_FORMAT, "%s: checkpoint format version %u, this program reads versions 2 and %u", path,
                     version, GC_CKPT_VERSION);
        goto done;
    }
    if ((rc = gc_take(&r, magic, 8, "magic")) || (rc = gc_take(&r, &version, 4, "version")) ||
        (rc = gc_take(&r, &count, 4, "tensor count")) ||
        (rc = gc_take(&r, head, sizeof(uint64_t) * (version == 2 ? 6 : 7), "header")) ||
        (rc = gc_take(&r, &loss_sum, 8, "header"))) goto done;
    // Another program's file (another layout hash) is read on, so that the message names what differs: the
    // first tensor this program does not have or has otherwise, a variable missing, or only the hash.
    if (head[0] != layout_hash && !model_only) {
        snprintf(other, sizeof other, "written by a different program (parameter layout hash %016llx, this "
                 "program's is %016llx)", (unsigned long long)head[0], (unsigned long long)layout_hash);
        sep = ": ";
    }
    for (uint32_t k = 0; k < count; k++) {
        uint16_t len = 0;
        uint8_t dt = 0, nd = 0;
        uint64_t dims[255], nbytes = 0;
        char name[256];
        size_t at = r.at;
        if ((rc = gc_take(&r, &len, 2, "name length"))) goto done;
        if (len >= sizeof name) { rc = gc_fail(GC_ERR_FORMAT, "%s: byte %zu: name length %u too long", path, at, len); goto done; }
        if ((rc = gc_take(&r, name, len, "name")) || (rc = gc_take(&r, &dt, 1, "dtype")) || (rc = gc_take(&r, &nd, 1, "ndim")) ||
            (rc = gc_take(&r, dims, 8 * (size_t)nd, "dims")) || (rc = gc_take(&r, &nbytes, 8, "byte count"))) goto done;
        int i = 0;
        while (i < n && (strlen(table[i].name) != len || memcmp(table[i].name, name, len) != 0)) i++;
        gc_printable(name, name, len);   // from here on, the name only appears in messages
        if (model_only && (i == n || !table[i].model)) {   // not the model's: passed over
            if (nbytes > r.n - r.at) {
                rc = gc_fail(GC_ERR_FORMAT, "%s: tensor '%s' truncated at byte %zu", path, name, r.at);
                goto done;
            }
            r.at += nbytes;
            continue;
        }
        if (i == n) {
            rc = gc_fail(GC_ERR_FORMAT, "%s: %s%sbyte %zu: tensor '%s' is not a variable of this program", path, other,
                         sep, at, name);
            goto done;
        }
        if (src[i]) { rc = gc_fail(GC_ERR_FORMAT, "%s: byte %zu: tensor '%s' appears twice", path, at, name); goto done; }
        int same = dt == table[i].dtype && nd == table[i].ndim && nbytes == table[i].nbytes;
        for (int d = 0; same && d < nd; d++) same = dims[d] == (uint64_t)table[i].dims[d];
        if (!same) {
            char theirs[160], ours[160];
            uint64_t own[255];
            for (int d = 0; d < table[i].ndim; d++) own[d] = (uint64_t)table[i].dims[d];
            gc_tensor_text(theirs, sizeof theirs, dt, dims, nd);
            gc_tensor_text(ours, sizeof ours, table[i].dtype, own, table[i].ndim);
            rc = gc_fail(GC_ERR_FORMAT, "%s: %s%sbyte %zu: tensor '%s' is %s in the file, %s in this program", path,
                         other, sep, at, name, theirs, ours);
            goto done;
        }
        if (nbytes > r.n - r.at) {
            rc = gc_fail(GC_ERR_FORMAT, "%s: tensor '%s' truncated at byte %zu", path, name, r.at);
            goto done;
        }
        src[i] = r.p + r.at;
        r.at += nbytes;
    }
    if (r.at != r.n) {
        rc = gc_fail(GC_ERR_FORMAT, "%s: %zu unexpected bytes after the last tensor at byte %zu", path, r.n - r.at, r.at);
        goto done;
    }
    for (int i = 0; i < n; i++)
        if (!src[i] && (!model_only || table[i].model)) {
            rc = gc_fail(GC_ERR_FORMAT, "%s: %s%svariable '%s' is missing", path, other, sep, table[i].name);
            goto done;
        }
    if (other[0]) { rc = gc_fail(GC_ERR_FORMAT, "%s: %s", path, other); goto done; }
    for (int i = 0; arena && i < n; i++)
        if (src[i] && (rc = gc_copy_to_device(arena + table[i].offset, src[i], table[i].nbytes)))
            goto done;
    if (st) {
        st->step = head[1]; st->epoch = head[2]; st->epoch_step = head[3]; st->seed = head[4]; st->shuffle = head[5];
        st->batch = head[6];
        st->loss_sum = loss_sum;
    }
done:
    free(src);
    free(file);
    return rc;
}
#endif   // GC_HOST
