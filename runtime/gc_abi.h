// gc_abi.h — the C ABI of every generated program (the shared library's interface; Python's gc.load uses it).
// Every entry point checks its arguments and returns a GC_* code; gc_last_error() says what went wrong (per
// thread). Inputs and outputs are host arrays in the order of the tables above, with exactly the sizes
// listed there. gc_check_file (in gc_main.h, next to the dataset reader it shares) is part of the ABI too.
// A POSIX mutex, not std::mutex: <mutex> brings in much of the C++ library, which every compiler process
// (preprocessor, cudafe++, cicc, the host compiler) parses again — about 0.7 s of a cold build.
#if GC_HOST   // the host part (gc_runtime.h)
#include <pthread.h>

#define GC_EXPORT extern "C" __attribute__((visibility("default")))

struct gc_model {
    gc_model* next;         // in the list of live models
    unsigned char* arena;   // the one device allocation: GC_ARENA_BYTES
    gc_train_state state;   // the trainer's position (steps, epochs, data order), saved in checkpoints
    gc_graphs graphs;       // captured CUDA graphs of this model's work, freed by gc_destroy
    float* input;           // GC_X_ROWS: the library's image batch, outside the arena (gc_library_input)
};

// The live models. Every entry point finds its handle here before touching it, so a destroyed (or never
// created) handle is reported as an error instead of being dereferenced.
static gc_model* gc_live_models = NULL;
static pthread_mutex_t gc_live_lock = PTHREAD_MUTEX_INITIALIZER;

// Holds gc_live_lock for the scope it is declared in.
struct gc_live_hold {
    gc_live_hold() { pthread_mutex_lock(&gc_live_lock); }
    ~gc_live_hold() { pthread_mutex_unlock(&gc_live_lock); }
};

// What a captured graph does (the key of gc_graphs, with a tag and a length).
enum {
    GC_GRAPH_TRAIN = 1,       // train steps on the inputs in the arena (gc_train_step, gc_time_steps)
    GC_GRAPH_EVAL = 2,        // forward passes on the inputs in the arena (gc_forward, gc_time_steps)
    GC_GRAPH_TRAINER_STEPS = 3,   // the trainer's steps: gather + train step (runtime/gc_main.h)
    GC_GRAPH_TRAINER_EVAL = 4,    // the trainer's evaluation of a whole split
};

// The library's steps read x from its input buffer (GC_X_ROWS; see gc_library_input).
static void gc_library_batch(gc_model* m) {
    gc_rows in = {m->input, NULL, 1.0f, 0};
    *gc_batch_input() = in;
}

static int gc_enqueue_train(void* model, int64_t steps) {
    gc_library_batch((gc_model*)model);
    for (int64_t i = 0; i < steps; i++) GC_TRY(gc_run_train(((gc_model*)model)->arena, NULL));
    return GC_OK;
}

static int gc_enqueue_eval(void* model, int64_t steps) {
    gc_library_batch((gc_model*)model);
    for (int64_t i = 0; i < steps; i++) GC_TRY(gc_run_eval(((gc_model*)model)->arena, NULL));
    return GC_OK;
}

static int gc_check_model(const gc_model* m, const char* fn) {
    if (!m) return gc_fail(GC_ERR_ARG, "%s: model handle is NULL", fn);
    gc_live_hold hold;
    for (const gc_model* live = gc_live_models; live; live = live->next)
        if (live == m) return GC_OK;
    return gc_fail(GC_ERR_ARG, "%s: model handle is not a live model (destroyed, or never created)", fn);
}

static const gc_tensor_info* gc_find(const gc_tensor_info* table, int n, const char* name) {
    for (int i = 0; i < n; i++)
        if (strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

// Where the GEMMs read x in place (GC_X_ROWS: the arena holds x's row indices, not its values), the library's
// x is input data like the trainer's dataset: a buffer of batch x row floats outside the arena, allocated by
// the library's first step (the trainer never needs it and keeps to two allocations), read as rows
// 0..batch-1. Its steps are enqueued with it as the batch input (gc_batch_input).
static int gc_library_input(gc_model* m) {
    if (!GC_X_ROWS || m->input) return GC_OK;
    const size_t bytes = (size_t)GC_BATCH * GC_ROW * sizeof(float);
    GC_TRY(gc_device_alloc((void**)&m->input, bytes, "input batch"));
    return gc_device_zero(m->input, bytes);
}

// An input of class labels (classes > 0 in its table row): every value in [0, classes). Checked before any input
// is copied, so that a bad batch changes nothing (the kernels would give a NaN loss, and the guard would halt
// the updates), with the numpy executor's message.
static int gc_check_labels(const gc_tensor_info* t, const void* data, const char* fn, int i) {
    if (t->classes <= 0) return GC_OK;
    int64_t v, at = gc_bad_label(t->dtype, data, (int64_t)(t->nbytes / gc_dtype_sizes[t->dtype]), t->classes, &v);
    if (at >= 0)
        return gc_fail(GC_ERR_ARG, "%s: input %d (%s): label %lld at index %lld is outside [0, %lld)", fn, i, t->name,
                       (long long)v, (long long)at, (long long)t->classes);
    return GC_OK;
}

static int gc_copy_inputs(gc_model* m, const gc_tensor_info* table, int want, const void* const* inputs, int n,
                          const char* fn) {
    if (n != want) return gc_fail(GC_ERR_ARG, "%s: expected %d inputs, got %d", fn, want, n);
    if (n && !inputs) return gc_fail(GC_ERR_ARG, "%s: inputs is NULL", fn);
    for (int i = 0; i < n; i++)
        if (!inputs[i]) return gc_fail(GC_ERR_ARG, "%s: input %d (%s) is NULL", fn, i, table[i].name);
    for (int i = 0; i < n; i++) GC_TRY(gc_check_labels(&table[i], inputs[i], fn, i));
    GC_TRY(gc_library_input(m));
    for (int i = 0; i < n; i++) {
        const int rows = GC_X_ROWS && table[i].offset == GC_X_OFFSET;   // x: into the input buffer
        GC_TRY(gc_copy_to_device(rows ? (unsigned char*)m->input : m->arena + table[i].offset, inputs[i],
                                 table[i].nbytes));
    }
    return GC_OK;
}

GC_EXPORT const char* gc_last_error(void) { return gc_error_message; }
GC_EXPORT const char* gc_manifest(void) { return gc_manifest_json; }

GC_EXPORT void gc_destroy(gc_model* m) {
    {
        gc_live_hold hold;
        gc_model** link = &gc_live_models;
        while (*link && *link != m) link = &(*link)->next;
        if (!m || !*link) return;   // NULL, or not a live model: nothing to free
        *link = m->next;
    }
    gc_graphs_free(&m->graphs);
    gc_device_free(m->arena);
    gc_device_free(m->input);
    free(m);
}

GC_EXPORT int gc_create(gc_model** out) {
    if (!out) return gc_fail(GC_ERR_ARG, "gc_create: out is NULL");
    *out = NULL;
    GC_TRY(gc_device_check());
    gc_model* m = (gc_model*)calloc(1, sizeof *m);
    if (!m) return gc_fail(GC_ERR_MEMORY, "gc_create: out of host memory");
    m->graphs.enabled = gc_graphs_default();
    m->state.batch = GC_BATCH;
    int rc = gc_device_alloc((void**)&m->arena, GC_ARENA_BYTES, "arena");
    if (rc == GC_OK) rc = gc_device_zero(m->arena, GC_ARENA_BYTES);
    for (int i = 0; rc == GC_OK && i < GC_N_CONSTANTS; i++)
        rc = gc_copy_to_device(m->arena + gc_constants[i].offset, gc_constants[i].data, gc_constants[i].nbytes);
    // Variables start at zero (their compiled values are the init file's: gc_load it), the guard running: a
    // zeroed guard reads "halted at step 0", and refused every step of a model used before a gc_load.
    const gc_tensor_info* halted = gc_find(gc_variables, GC_N_VARIABLES, "guard.halted_at");
    const int32_t running = -1;
    if (rc == GC_OK && halted) rc = gc_copy_to_device(m->arena + halted->offset, &running, sizeof running);
    if (rc != GC_OK) {
        gc_device_free(m->arena);
        free(m);
        return rc;
    }
    gc_live_hold hold;
    m->next = gc_live_models;
    gc_live_models = m;
    *out = m;
    return GC_OK;
}

// ---- the numerical guard (gcompile/optim.py): its state lives in three int32 variables ---------------
typedef struct { int32_t skip, nonfinite_steps, halted_at; } gc_guard;

static int gc_has_guard(void) { return gc_find(gc_variables, GC_N_VARIABLES, "guard.halted_at") != NULL; }

static int gc_guard_read(gc_model* m, gc_guard* g) {
    const char* names[3] = {"guard.skip", "guard.nonfinite_steps", "guard.halted_at"};
    int32_t* values[3] = {&g->skip, &g->nonfinite_steps, &g->halted_at};
    for (int i = 0; i < 3; i++) {
        const gc_tensor_info* t = gc_find(gc_variables, GC_N_VARIABLES, names[i]);
        if (!t) return gc_fail(GC_ERR_ARG, "this program has no numerical guard (it was built without an optimizer)");
        GC_TRY(gc_copy_to_host(values[i], m->arena + t->offset, sizeof(int32_t)));
    }
    return GC_OK;
}

GC_EXPORT int gc_train_step(gc_model* m, const void* const* inputs, int n, double* loss) {
    GC_TRY(gc_check_model(m, "gc_train_step"));
    if (!GC_HAS_TRAIN_STEP) return gc_fail(GC_ERR_ARG, "gc_train_step: this program has no training step");
    GC_TRY(gc_copy_inputs(m, gc_train_inputs, GC_N_TRAIN_INPUTS, inputs, n, "gc_train_step"));
    GC_TRY(gc_replay(&m->graphs, GC_GRAPH_TRAIN, NULL, 1, gc_enqueue_train, m, "the train step"));
    double value;   // the loss in the program's float type
    if (GC_LOSS_F64) {
        GC_TRY(gc_copy_to_host(&value, m->arena + GC_LOSS_OFFSET, sizeof value));
    } else {
        float f;
        GC_TRY(gc_copy_to_host(&f, m->arena + GC_LOSS_OFFSET, sizeof f));
        value = f;
    }
    m->state.step++;
    if (loss) *loss = value;
    if (!gc_has_guard()) return GC_OK;
    gc_guard g;
    GC_TRY(gc_guard_read(m, &g));
    if (g.halted_at < 0) return GC_OK;
    // this step halted when the counter (the device's `step`: a host may have set it) is one past halted_at
    const gc_tensor_info* counter = gc_find(gc_variables, GC_N_VARIABLES, "step");
    int32_t after = INT32_MIN;
    if (counter) GC_TRY(gc_copy_to_host(&after, m->arena + counter->offset, sizeof after));
    if (counter && (int64_t)g.halted_at + 1 == after)
        return gc_fail(GC_ERR_NUMERIC, "gc_train_step: step %d: non-finite loss (%g): its update was not applied, "
                       "and no later step applies one until guard.halted_at is set back to -1 (set guard.skip to 1 "
                       "to skip such steps instead)", g.halted_at, value);
    return gc_fail(GC_ERR_NUMERIC, "gc_train_step: updates are stopped since step %d, whose loss was not finite; "
                   "set guard.halted_at back to -1 to go on", g.halted_at);
}

GC_EXPORT int gc_forward(gc_model* m, const void* const* inputs, int n, void* const* outputs, int n_out) {
    GC_TRY(gc_check_model(m, "gc_forward"));
    GC_TRY(gc_copy_inputs(m, gc_eval_inputs, GC_N_EVAL_INPUTS, inputs, n, "gc_forward"));
    if (n_out != GC_N_EVAL_OUTPUTS) return gc_fail(GC_ERR_ARG, "gc_forward: expected %d outputs, got %d", GC_N_EVAL_OUTPUTS, n_out);
    if (n_out && !outputs) return gc_fail(GC_ERR_ARG, "gc_forward: outputs is NULL");
    for (int i = 0; i < n_out; i++)
        if (!outputs[i]) return gc_fail(GC_ERR_ARG, "gc_forward: output %d (%s) is NULL", i, gc_eval_outputs[i].name);
    GC_TRY(gc_replay(&m->graphs, GC_GRAPH_EVAL, NULL, 1, gc_enqueue_eval, m, "the forward pass"));
    for (int i = 0; i < n_out; i++)
        GC_TRY(gc_copy_to_host(outputs[i], m->arena + gc_eval_outputs[i].offset, gc_eval_outputs[i].nbytes));
    return GC_OK;
}

// Seconds of device time for `steps` train (which 0) or eval (which 1) steps on the inputs already in the
// arena, replayed as the trainer replays them: graphs of gc_steps_per_graph(steps) steps and a remainder.
// Before the clock starts, the graphs are captured and one of them runs as a warm-up (train steps in the
// warm-up also update the parameters). CUDA events on cuda, the wall clock on cpu.
GC_EXPORT int gc_time_steps(gc_model* m, int which, int steps, double* seconds) {
    GC_TRY(gc_check_model(m, "gc_time_steps"));
    if (which != 0 && which != 1)
        return gc_fail(GC_ERR_ARG, "gc_time_steps: which is %d, not 0 (train) or 1 (eval)", which);
    if (steps < 1) return gc_fail(GC_ERR_ARG, "gc_time_steps: steps is %d, must be at least 1", steps);
    if (!seconds) return gc_fail(GC_ERR_ARG, "gc_time_steps: seconds is NULL");
    if (which == 0 && !GC_HAS_TRAIN_STEP)
        return gc_fail(GC_ERR_ARG, "gc_time_steps: this program has no training step");
    GC_TRY(gc_library_input(m));   // the inputs of the last library call (zeros before any)
    const int kind = which == 0 ? GC_GRAPH_TRAIN : GC_GRAPH_EVAL;
    gc_enqueue_fn enqueue = which == 0 ? gc_enqueue_train : gc_enqueue_eval;
    const char* what = which == 0 ? "train steps" : "forward passes";
    const int64_t per_graph = gc_steps_per_graph(steps);
    gc_graph* graph;
    if (steps % per_graph) GC_TRY(gc_graph_get(&m->graphs, kind, NULL, steps % per_graph, enqueue, m, what, &graph));
    GC_TRY(gc_replay(&m->graphs, kind, NULL, per_graph, enqueue, m, what));
    gc_timer timer;
    GC_TRY(gc_timer_start(&timer));
    const int run = gc_replay_steps(&m->graphs, kind, NULL, steps, per_graph, enqueue, m, what);
    if (run != GC_OK) {
        gc_timer_discard(&timer);
        return run;
    }
    GC_TRY(gc_timer_stop(&timer, seconds));
    if (which == 0) m->state.step += per_graph + steps;
    return GC_OK;
}

static int gc_variable_access(gc_model* m, const char* name, size_t nbytes, const void* src, void* dst, const char* fn) {
    GC_TRY(gc_check_model(m, fn));
    if (!name) return gc_fail(GC_ERR_ARG, "%s: name is NULL", fn);
    const gc_tensor_info* t = gc_find(gc_variables, GC_N_VARIABLES, name);
    if (!t) return gc_fail(GC_ERR_ARG, "%s: no variable named '%s'", fn, name);
    if (nbytes != t->nbytes) return gc_fail(GC_ERR_ARG, "%s: variable '%s' has %zu bytes, got %zu", fn, name, t->nbytes, nbytes);
    if (!(src || dst)) return gc_fail(GC_ERR_ARG, "%s: data pointer is NULL", fn);
    if (src) {
        GC_TRY(gc_copy_to_device(m->arena + t->offset, src, nbytes));
        return gc_refresh_mirrors(m->arena, (long long)t->offset);   // its mirror (if any) follows
    }
    return gc_copy_to_host(dst, m->arena + t->offset, nbytes);
}

GC_EXPORT int gc_get_variable(gc_model* m, const char* name, void* dst, size_t nbytes) {
    if (!dst) return gc_fail(GC_ERR_ARG, "gc_get_variable: data pointer is NULL");
    return gc_variable_access(m, name, nbytes, NULL, dst, "gc_get_variable");
}

GC_EXPORT int gc_set_variable(gc_model* m, const char* name, const void* src, size_t nbytes) {
    if (!src) return gc_fail(GC_ERR_ARG, "gc_set_variable: data pointer is NULL");
    return gc_variable_access(m, name, nbytes, src, NULL, "gc_set_variable");
}

GC_EXPORT int gc_save(gc_model* m, const char* path) {
    GC_TRY(gc_check_model(m, "gc_save"));
    if (!path) return gc_fail(GC_ERR_ARG, "gc_save: path is NULL");
    return gc_checkpoint_save(path, gc_variables, GC_N_VARIABLES, GC_LAYOUT_HASH, &m->state, m->arena);
}

GC_EXPORT int gc_load(gc_model* m, const char* path) {
    GC_TRY(gc_check_model(m, "gc_load"));
    if (!path) return gc_fail(GC_ERR_ARG, "gc_load: path is NULL");
    GC_TRY(gc_checkpoint_load(path, gc_variables, GC_N_VARIABLES, GC_LAYOUT_HASH, &m->state, m->arena, 0));
    return gc_refresh_mirrors(m->arena, -1);   // the variables' mirrors follow
}

// The trainer's --load: a checkpoint's model (gc_tensor_info.model), the rest as it is; the file may come from
// a build with other optimizer state.
static int gc_load_model(gc_model* m, const char* path) {
    GC_TRY(gc_checkpoint_load(path, gc_variables, GC_N_VARIABLES, GC_LAYOUT_HASH, NULL, m->arena, 1));
    return gc_refresh_mirrors(m->arena, -1);
}
#endif   // GC_HOST
