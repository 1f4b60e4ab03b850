"""Fuzzing: random dataset files, checkpoint bytes and ABI calls — zero crashes, zero hangs, every bad input
refused with a clear message, and nothing bad accepted (what the C readers accept, numpy and the Python
checkpoint reader must find valid too); and random graphs, compiled for the cpu target, against numpy.

Seeds come from tests/fuzz_corpus/. Every C call runs under a watchdog (a hang fails the test); a crash would
take the test process down. The counts are printed at the end of the session (terminal summary), and each
test asserts its share, so that together they pass 1000 bad inputs.
"""
from __future__ import annotations

import io
import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import gcompile as gc
from gcompile.data import read_idx
from gcompile.loader import ffi
from gcompile.passes import simplify
from gcompile.passes.plan_memory import storage_root
from graphs import random_graphs
from reliability import BATCH, CLASSES, FEATURES, resealed, small_program

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
DATASET_SEEDS = sorted((CORPUS / "datasets").iterdir())
CHECKPOINT_SEEDS = sorted((CORPUS / "checkpoints").glob("*.ckpt"))
DATASET_FILES = ("train_images.npy", "train_labels.npy")
HANG_SECONDS = 20
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

COUNTS: Counter = Counter()   # (what, outcome) -> inputs; "refused": a bad input, refused with a clear message


def refused_total() -> int:
    return sum(n for (_, outcome), n in COUNTS.items() if outcome == "refused")


class FuzzReport:
    """Prints the counts at the end of the session, whatever pytest's output capture. A crash would have
    ended the session and a hang failed its test, so a printed report means there were none."""

    def pytest_terminal_summary(self, terminalreporter):
        if not COUNTS:
            return
        terminalreporter.section("fuzzing")
        for what in sorted({w for w, _ in COUNTS}):
            outcomes = ", ".join(f"{n} {outcome}" for (w, outcome), n in sorted(COUNTS.items()) if w == what)
            terminalreporter.write_line(f"{what}: {outcomes}")
        terminalreporter.write_line(f"total: {refused_total()} bad inputs refused with a clear message; "
                                    "0 crashes, 0 hangs")


@pytest.fixture(scope="module", autouse=True)
def fuzz_report(request):
    if not request.config.pluginmanager.has_plugin("gcompile-fuzz-report"):
        request.config.pluginmanager.register(FuzzReport(), "gcompile-fuzz-report")


def within(function, *args):
    """Call `function` in a thread and wait HANG_SECONDS at most: a hang fails the test (cffi releases the GIL
    around C calls, so the watchdog keeps running)."""
    result = {}

    def call():
        try:
            result["value"] = function(*args)
        except BaseException as e:  # noqa: BLE001 - handed to the caller as is
            result["error"] = e

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(HANG_SECONDS)
    if worker.is_alive():
        pytest.fail(f"hang: {getattr(function, '__name__', function)}{args!r} still running after {HANG_SECONDS} s")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def clear(message: str, names: str) -> None:
    """A clear message names the file (or call) and says more than that."""
    assert message.startswith(names) and len(message) > len(names) + 10 and "(null)" not in message, message


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return gc.compile(small_program(), target="cpu", out_dir=tmp_path_factory.mktemp("small"))


@pytest.fixture(scope="module")
def model(artifact):
    with gc.load(artifact) as m:
        yield m


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def test_corpus_is_current(model):
    """ok-* seeds are accepted and bad-* refused (else: PYTHONPATH=. python3 tests/fuzz_corpus/make_corpus.py)."""
    assert len(DATASET_SEEDS) >= 20 and len(CHECKPOINT_SEEDS) >= 10
    for kind, seeds in (("train", DATASET_SEEDS), ("checkpoint", CHECKPOINT_SEEDS)):
        for seed in seeds:
            try:
                model.check_file(kind, seed)
                accepted = True
            except gc.DataError:
                accepted = False
            assert accepted == seed.name.startswith("ok-"), f"{seed}: regenerate the corpus (make_corpus.py)"


# --- byte mutations ------------------------------------------------------------------------------------------
@st.composite
def mutated(draw, data: bytes) -> bytes:
    how = draw(st.sampled_from(["truncate", "append", "overwrite", "overwrite-header", "insert", "replace"]))
    if how == "replace" or not data:
        return draw(st.binary(max_size=300))
    if how == "truncate":
        return data[:draw(st.integers(0, len(data) - 1))]
    if how == "append":
        return data + draw(st.binary(min_size=1, max_size=16))
    at = draw(st.integers(0, min(len(data), 160 if how == "overwrite-header" else len(data)) - 1))
    patch = draw(st.binary(min_size=1, max_size=8))
    return data[:at] + patch + data[at + (0 if how == "insert" else len(patch)):]


DTYPES = ["u1", "f4", "<i4", "<i8", "<f8", "<i2", ">f4", ">i4", "?", "u2"]


def npy(array) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@st.composite
def damaged_datasets(draw) -> dict:
    seed = draw(st.sampled_from(DATASET_SEEDS))
    files = {name: (seed / name).read_bytes() for name in DATASET_FILES}
    target = draw(st.sampled_from(DATASET_FILES))
    if draw(st.booleans()):
        files[target] = draw(mutated(files[target]))
    else:   # a well-formed .npy of another shape, dtype or content
        shape = draw(st.one_of(st.just((40, FEATURES) if target == DATASET_FILES[0] else (40,)),
                               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=41)))
        files[target] = npy(draw(hnp.arrays(st.sampled_from(DTYPES).map(np.dtype), shape)))
    return files


def python_accepts(folder: Path) -> bool:
    """The trainer's rules, checked with numpy: what the C reader accepts must pass them."""
    arrays = []
    for name in DATASET_FILES:
        raw = (folder / name).read_bytes()
        try:
            arrays.append(read_idx(folder / name) if raw[:2] == b"\0\0" else np.load(folder / name,
                                                                                        allow_pickle=False))
        except Exception:  # noqa: BLE001 - any failure to read means "not valid"
            return False
    images, labels = arrays
    n = images.shape[0] if images.ndim else 0
    return (images.dtype in (np.uint8, np.float32) and images.dtype.byteorder in "=|<" and n > 0
            and images.size == n * FEATURES and labels.shape == (n,)
            and labels.dtype in (np.uint8, np.int32, np.int64) and labels.dtype.byteorder in "=|<"
            and int(labels.min()) >= 0 and int(labels.max()) < CLASSES and bool(np.isfinite(images).all()))


@settings(FUZZ, max_examples=500)
@given(files=damaged_datasets())
def test_fuzz_dataset_files(model, scratch, files):
    folder = scratch / "dataset"
    folder.mkdir(exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    try:
        within(model.check_file, "train", folder)
    except gc.DataError as e:
        clear(str(e), f"{folder}/train_")
        COUNTS["dataset files", "refused"] += 1
        return
    assert python_accepts(folder), "the C reader accepted a dataset numpy finds invalid"
    COUNTS["dataset files", "accepted"] += 1


def test_dataset_fuzzing_saw_enough_bad_inputs():
    assert COUNTS["dataset files", "refused"] >= 350, COUNTS


# --- checkpoints -----------------------------------------------------------------------------------------------
@st.composite
def damaged_checkpoints(draw) -> bytes:
    data = draw(mutated(draw(st.sampled_from(CHECKPOINT_SEEDS)).read_bytes()))
    if len(data) >= 4 and draw(st.booleans()):
        data = resealed(data[:-4])   # a correct CRC: the change reaches the parser behind the checksum
    return data


@settings(FUZZ, max_examples=500)
@given(data=damaged_checkpoints())
def test_fuzz_checkpoints(model, scratch, data):
    path = scratch / "fuzzed.ckpt"
    path.write_bytes(data)
    try:
        from_python = gc.read_checkpoint(path)   # only DataError may come out of it
    except gc.DataError as e:
        clear(str(e), f"{path}: ")
        from_python = None
    try:
        within(model.check_file, "checkpoint", path)
    except gc.DataError as e:
        clear(str(e), f"{path}: ")
        COUNTS["checkpoints", "refused"] += 1
        return
    assert from_python is not None, "the C reader accepted a checkpoint the Python reader refuses"
    variables = {v["name"]: (tuple(v["shape"]), v["dtype"]) for v in model.manifest["variables"]}
    assert {k: (v.shape, v.dtype.name) for k, v in from_python.tensors.items()} == variables
    within(model.load, path)
    COUNTS["checkpoints", "accepted"] += 1


def test_checkpoint_fuzzing_saw_enough_bad_inputs():
    assert COUNTS["checkpoints", "refused"] >= 350, COUNTS


# --- ABI calls through Model -----------------------------------------------------------------------------------
VALUES = st.one_of(
    st.lists(st.none(), max_size=3).map(lambda v: np.array(v, dtype=object)),
    hnp.arrays(st.sampled_from(DTYPES + ["f4", "i4", "U3", "c8"]).map(np.dtype),
               st.one_of(st.sampled_from([(BATCH, FEATURES), (BATCH,), (6, 5), (5,), ()]),
                         hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=7))),
    st.integers(-2**70, 2**70), st.floats(), st.none(), st.text(max_size=4), st.binary(max_size=4),
    st.lists(st.floats(-2, 2), max_size=6), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2))
NAMES = st.one_of(st.sampled_from(["W1", "b1", "W2", "lr", "step", "guard.skip", "W1.velocity", "checkpoint",
                                   "train"]),
                  st.text(max_size=12), st.integers(), st.none())
PATHS = st.one_of(st.text(alphabet=st.characters(blacklist_characters="/"), max_size=10), st.integers(),
                  st.none(), st.just(".."))
CALLS = st.one_of(
    st.tuples(st.just("train_step"), st.lists(VALUES, max_size=3)),
    st.tuples(st.just("forward"), st.lists(VALUES, max_size=2)),
    st.tuples(st.just("predict"), st.lists(VALUES, max_size=2)),
    st.tuples(st.just("get"), st.tuples(NAMES)),
    st.tuples(st.just("set"), st.tuples(NAMES, VALUES)),
    st.tuples(st.just("save"), st.tuples(PATHS)),
    st.tuples(st.just("load"), st.tuples(st.one_of(PATHS, st.sampled_from([str(p) for p in CHECKPOINT_SEEDS])))),
    st.tuples(st.just("check_file"), st.tuples(NAMES, PATHS)),
    st.tuples(st.just("close"), st.just(())),
)


def in_scratch(scratch: Path, value):
    return scratch / value if isinstance(value, str) and not value.startswith("/") else value


@settings(FUZZ, max_examples=150)
@given(calls=st.lists(CALLS, min_size=1, max_size=8))
def test_fuzz_model_calls(artifact, scratch, calls):
    """Any sequence of calls with any arguments: each succeeds or raises a GCompileError with a message."""
    model = gc.load(artifact)
    (scratch / "calls").mkdir(exist_ok=True)
    try:
        for method, args in calls:
            if method in ("save", "load", "check_file"):
                args = (*args[:-1], in_scratch(scratch / "calls", args[-1]))
            try:
                within(getattr(model, method), *args)
                COUNTS["ABI calls (gc.load's Model)", "accepted"] += 1
            except gc.GCompileError as e:
                assert len(str(e)) > 10, repr(e)
                COUNTS["ABI calls (gc.load's Model)", "refused"] += 1
    finally:
        model.close()


# --- raw C calls, below Model's own checks ---------------------------------------------------------------------
HANDLES = st.sampled_from(["live", "null", "destroyed", "never created"])
INPUTS = st.sampled_from(["valid", "null", "null entry"])
RAW_NAMES = st.one_of(st.sampled_from([b"W1", b"b1", b"W2", b"step", b"lr"]), st.none(),
                      st.binary(max_size=20).map(lambda b: b.replace(b"\0", b"")))
NBYTES = st.one_of(st.sampled_from([0, 4, 20, 60, 120]), st.integers(0, 4096), st.integers(2**32, 2**63))
RAW_CALLS = st.one_of(
    st.tuples(st.just("gc_train_step"), HANDLES, INPUTS, st.integers(-3, 5)),
    st.tuples(st.just("gc_forward"), HANDLES, INPUTS, st.integers(-3, 5), st.booleans(), st.integers(-3, 5)),
    st.tuples(st.just("gc_get_variable"), HANDLES, RAW_NAMES, NBYTES),
    st.tuples(st.just("gc_set_variable"), HANDLES, RAW_NAMES, NBYTES),
    st.tuples(st.just("gc_save"), HANDLES, st.one_of(st.none(), st.binary(max_size=12))),
    st.tuples(st.just("gc_load"), HANDLES, st.one_of(st.none(), st.binary(max_size=12))),
    st.tuples(st.just("gc_check_file"), st.one_of(st.none(), st.sampled_from([b"checkpoint", b"train", b"x"]),
                                                  st.binary(max_size=8)), st.one_of(st.none(), st.binary(max_size=12))),
)


class RawABI:
    """Handles of every kind and buffers of the right sizes for the small program (the C ABI cannot know the
    size of what a pointer points to; everything else it checks)."""

    def __init__(self, model, scratch: Path):
        self.lib = model.lib
        self.scratch = scratch
        created = ffi.new("gc_model**")
        assert self.lib.gc_create(created) == 0
        self.destroyed = created[0]
        self.lib.gc_destroy(self.destroyed)
        self.memory = np.zeros(1024, np.float64)   # 8 KiB: more than any nbytes that matches a variable
        self.handles = {"live": model.handle, "null": ffi.NULL, "destroyed": self.destroyed,
                        "never created": ffi.cast("gc_model*", ffi.from_buffer(self.memory))}
        r = np.random.RandomState(0)
        self.x = r.uniform(0, 1, (BATCH, FEATURES)).astype(np.float32)
        self.y = r.randint(0, CLASSES, BATCH).astype(np.int32)
        self.logits = np.zeros((BATCH, CLASSES), np.float32)
        valid = [ffi.from_buffer(self.x), ffi.from_buffer(self.y), ffi.NULL, ffi.NULL, ffi.NULL]
        self.inputs = {"valid": ffi.new("void*[]", valid), "null": ffi.NULL,
                       "null entry": ffi.new("void*[]", [valid[0]] + [ffi.NULL] * 4)}
        self.outputs = ffi.new("void*[]", [ffi.from_buffer(self.logits)] + [ffi.NULL] * 4)

    def string(self, value):
        return ffi.NULL if value is None else value

    def path(self, value):
        return ffi.NULL if value is None else str(self.scratch / value.replace(b"/", b"_").decode("latin-1")).encode()

    def call(self, name, *args) -> int:
        lib, h = self.lib, self.handles
        if name == "gc_train_step":
            return lib.gc_train_step(h[args[0]], self.inputs[args[1]], args[2], ffi.NULL)
        if name == "gc_forward":
            outputs = self.outputs if args[3] else ffi.NULL
            return lib.gc_forward(h[args[0]], self.inputs[args[1]], args[2], outputs, args[4])
        if name in ("gc_get_variable", "gc_set_variable"):
            return getattr(lib, name)(h[args[0]], self.string(args[1]), ffi.from_buffer(self.memory), args[2])
        if name in ("gc_save", "gc_load"):
            return getattr(lib, name)(h[args[0]], self.path(args[1]))
        return lib.gc_check_file(self.string(args[0]), self.path(args[1]))


@pytest.fixture(scope="module")
def raw(model, scratch):
    (scratch / "raw").mkdir()
    return RawABI(model, scratch / "raw")


@settings(FUZZ, max_examples=150)
@given(calls=st.lists(RAW_CALLS, min_size=1, max_size=10))
def test_fuzz_raw_c_calls(raw, calls):
    for name, *args in calls:
        rc = within(raw.call, name, *args)
        if rc == 0:
            COUNTS["ABI calls (raw C)", "accepted"] += 1
            continue
        message = ffi.string(raw.lib.gc_last_error()).decode(errors="replace")
        clear(message, "")
        COUNTS["ABI calls (raw C)", "refused"] += 1


def test_abi_fuzzing_saw_enough_bad_inputs():
    refused = COUNTS["ABI calls (gc.load's Model)", "refused"] + COUNTS["ABI calls (raw C)", "refused"]
    assert refused >= 300, COUNTS
    print(f"fuzzing: {refused_total()} bad inputs refused ({dict(COUNTS)})")
    assert refused_total() >= 1000


# --- random graphs: compiled (cpu) == numpy ------------------------------------------------------------------
@st.composite
def graph_batches(draw, graphs=6):
    """Several random graphs (tests/graphs.py) in one program, so one compile checks them all.

    An output that simplify turns into an assigned variable itself (a transpose of a (1,) vector, say) is
    left out: the compiled program returns such an output after the step's writes (it is the variable's
    buffer), the numpy executor before them — the same exception random_graphs makes for reshapes."""
    outputs, feed = [], {}
    for i in range(graphs):
        out, f = draw(random_graphs(prefix=f"g{i}_"))
        outputs += out
        feed.update(f)
    assigned = {o.inputs[0] for o in outputs if o.op == "assign"}
    kept = [o for o, s in zip(outputs, simplify(outputs)) if o.op == "assign" or storage_root(s) not in assigned]
    return kept, feed


@settings(FUZZ, max_examples=6)
@given(batch=graph_batches())
def test_fuzz_random_graphs_compiled_equal_numpy(tmp_path_factory, batch):
    outputs, feed = batch
    reference = gc.NumpyExecutor(outputs)
    exact = gc.NumpyExecutor(outputs, dtype="float64")   # sets the scale of what float32 rounding can change
    with gc.load(gc.compile(outputs, target="cpu", out_dir=tmp_path_factory.mktemp("graphs"), name="graphs")) as m:
        names = [s["name"] for s in m.manifest["eval_inputs"]]
        for _ in range(2):   # twice: the assigns' writes must carry over
            want, want64 = reference.run(feed), exact.run(feed)
            got = m.forward(*(feed[next(p for p in feed if p.name == n)] for n in names))
            for node, g, w, w64 in zip(outputs, got.values(), want, want64):
                scale = max(1.0, float(np.max(np.abs(w64[np.isfinite(w64)]), initial=0)))
                np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale, err_msg=node.describe())
        for name, value in reference.variables.items():
            np.testing.assert_allclose(m.get(name), value, rtol=1e-4, atol=1e-5, err_msg=name)
    COUNTS["random graphs", "compared (compiled == numpy)"] += len(outputs)
