"""emit: render the ONE source file of a program with jinja2 (StrictUndefined).

Python prepares every value here — tables, layout rows, the trainer's constants, the manifest; the
templates in codegen_templates/ only place them. The runtime files are inlined, so the output compiles
with nothing but the CUDA toolkit (cuda target) or a C++ compiler with OpenMP (cpu target).
"""
from __future__ import annotations

import json
import jinja2
import networkx as nx
import numpy as np

from .. import __version__
from ..resources import package_dir
from ..graph import Node
from ..gemm_tiles import Tile
from .lower import C_TYPES, c_literal, overlap
from .plan_memory import gathered_rows
from .streams import assign_streams, early_copies

DTYPE_CODES = {"uint8": 0, "int32": 1, "float32": 2, "float64": 4}

RUNTIME_HEAD = [
    ("gc_runtime.h", "error codes and messages, the device abstraction, training order, CUDA graphs, timers"),
    ("gc_data.h", ".npy and IDX readers with full validation"),
    ("gc_checkpoint.h", "the checkpoint format: atomic save, checked load"),
]
RUNTIME_KERNELS = {
    "cuda": [("gc_gemm.h", "the GEMM's tile type and plain-store epilogue"),
             ("gc_gemm_cuda.cuh", "GEMM: register-blocked fp32 / tf32 tensor cores, fused epilogue, split-K"),
             ("gc_gemm_tc.cuh", "GEMM: tf32 tensor cores fed by a cp.async pipeline"),
             ("gc_gemm_wgmma.cuh", "GEMM: tf32 wgmma (Hopper) tensor cores fed by a cp.async pipeline"),
             ("gc_gemm_sk.cuh", "GEMM: fp32 on tensor cores (tf32 parts) for a short K slice staged whole"),
             ("gc_gemm_ws.cuh", "GEMM: tf32 wgmma, warp-specialized (producer warpgroups copy, mbarriers)"),
             ("gc_kernels_cuda.cuh", "generic CUDA kernels: fixed-order reductions for fused kernels, batch gather")],
    "cpu": [("gc_gemm.h", "the GEMM's tile type and plain-store epilogue"),
            ("gc_kernels_cpu.h", "generic kernels as OpenMP loops: GEMM with epilogues, batch gather")],
}
RUNTIME_CONV = ("gc_kernels_conv.h", "both targets: im2col/col2im, pooling and its gradient, Philox dropout masks")
RUNTIME_TAIL = [
    ("gc_abi.h", "the C ABI: create/destroy, train_step, forward, variables, save/load, last error"),
    ("gc_main.h", "the training command line (train / eval) of the standalone binary"),
]


def environment() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(package_dir("codegen_templates"))),
                              undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              trim_blocks=False, lstrip_blocks=False)


def runtime_parts(names) -> list[dict]:
    root = package_dir("runtime")
    return [{"name": f"runtime/{n}", "summary": s, "text": (root / n).read_text()} for n, s in names]


def tensor_row(node: Node, offset: int, comment: str = "", classes: int = 0, model: bool = False) -> dict:
    """A row of the generated tables (gc_tensor_info); classes: the bound of a label input's values; model: a
    variable of the model (the evaluation step reads it, or it is trained): what the trainer's --load takes
    from a checkpoint."""
    dims = list(node.shape) or []
    return {"name": c_text(node.name), "dtype": DTYPE_CODES[node.dtype], "ndim": len(dims),
            "dims": ", ".join(map(str, dims)) if dims else "0", "offset": offset, "nbytes": node.nbytes,
            "classes": classes, "model": int(model),
            # (a comment ends at a newline: an output's name may hold one)
            "comment": (comment or f"{tuple(node.shape)} {node.dtype}").translate({i: "?" for i in range(32)})}


C_ESCAPES = {ord('"'): '\\"', ord("\\"): "\\\\", ord("\n"): "\\n"}


def c_text(text: str) -> str:
    """One C string literal holding `text`'s UTF-8 bytes exactly: printable ASCII as itself, `"`, `\\` and a
    newline escaped as in C, every other byte as a three-digit octal escape (none runs into the next character;
    json's \\u escapes of surrogate pairs are not C)."""
    return '"' + "".join(C_ESCAPES.get(b) or (chr(b) if 32 <= b < 127 else f"\\{b:03o}")
                         for b in text.encode()) + '"'


def c_string(text: str) -> str:
    """A C string literal (split into lines) holding `text` exactly."""
    return "\n    ".join(map(c_text, text.splitlines(keepends=True))) or '""'


def kernel_gemms(k) -> list[tuple[str, dict]]:
    """The GEMMs a kernel computes, each as (the name its own epilogue type takes, its gemm values): a
    matmul's, a chain's GEMM stages', a chain's post GEMMs."""
    if k.kind == "matmul":
        return [(k.name, k.values)]
    if k.kind in ("chain", "post"):
        summed = [(f"{k.name}_sum", k.values["sum"])] if k.values.get("sum") else []   # its epilogue: the GEMM's
        return summed + [(f"{k.name}_s{i}", v) for i, v in enumerate(k.values["stages"]) if v["gemm"]]
    return []


def share_epilogues(kernels) -> None:
    """GEMMs whose epilogues are the same code share the first one's functor type (values["ep_type"]; the
    kernel that defines it has values["ep_defines"]). The eval graph's forward GEMMs repeat the train
    graph's, so this makes one gc_gemm_kernel instantiation of each instead of two: cicc and ptxas
    optimize every instantiation separately, and they are most of a cold cuda build (docs/compiler.md)."""
    first = {}
    for k in kernels:
        for name, values in kernel_gemms(k):
            if values.get("epilogue"):
                key = json.dumps(values["epilogue"], sort_keys=True)
                values["ep_type"] = first.setdefault(key, f"{name}_ep")
                values["ep_defines"] = values["ep_type"] == f"{name}_ep"


# Kernels parts of a cuda build (build.part_commands): nvcc runs its steps one after another, and cicc's and
# ptxas's work grows with the GEMM instantiations (docs/compiler.md, "Compile time"); several nvcc runs, each
# on a share of the kernels, overlap. The count follows from the kernels, not from the machine, so that the
# source and its build key are the same everywhere: a part per GEMMS_PER_PART estimated GEMM
# instantiations, at most MAX_PARTS (each run also preprocesses, parses and host-compiles the whole runtime).
MAX_PARTS = 4
GEMMS_PER_PART = 2
PART0_COST = 1.0   # part 0 also holds the steps and the runtime's kernels (gather, cursor, accuracy, probe)
LIGHT_COST = 0.1   # a fused or gather kernel: one plain __global__ function


def gemm_instance(values: dict) -> tuple:
    """A GEMM kernel's gc_gemm<T, TA, TB, Tile, Ep>: kernels with the same one share its template instantiation."""
    return (values["ctype"], values["trans_a"], values["trans_b"], values["tile"], values.get("ep_type"),
            values.get("partials", False))


def gemm_cost(kernels) -> float:
    """Estimated cost of a set of kernels that must share a part, in GEMM instantiations: each distinct
    gemm_instance is one kernel template instantiation (two when A is the image input read in place:
    gc_gemm_cuda.cuh instantiates the plain and the row-reading kernel), a chain about one."""
    gemms = {}
    cost = 0.0
    for k in kernels:
        v = k.values
        if k.kind == "matmul":
            key = gemm_instance(v)
            gemms[key] = max(gemms.get(key, 1), 2 if v["rows"] else 1)
        else:
            cost += 1.0 if k.kind == "chain" else LIGHT_COST
    return cost + sum(gemms.values())


def part_units(kernels) -> list[list]:
    """The kernels that must share a kernels part, in the order of their first kernel: a template
    instantiation compiled in two parts would be two copies of one kernel (and twice the work), so kernels
    that share a GEMM instantiation or an epilogue type (share_epilogues: defined by the first kernel, used
    by the others) are one unit."""
    shared = nx.Graph()   # a kernel and what it shares: its epilogue type, its GEMM instantiation
    for k in kernels:
        shared.add_node(("kernel", k.name))
        for _, values in kernel_gemms(k):
            if values.get("ep_type"):
                shared.add_edge(("kernel", k.name), ("epilogue", values["ep_type"]))
        if k.kind == "matmul":
            shared.add_edge(("kernel", k.name), ("gemm", gemm_instance(k.values)))
    unit_of = {n: i for i, component in enumerate(nx.connected_components(shared)) for n in component}
    units = {}   # in the order of their first kernel
    for k in kernels:
        units.setdefault(unit_of[("kernel", k.name)], []).append(k)
    return list(units.values())


def assign_parts(kernels, target: str) -> int:
    """Share the kernels out to the cuda build's kernels parts (values["part"]); returns how many. The
    units (part_units) go, heaviest first, to the least loaded part."""
    units = part_units(kernels)
    total = sum(gemm_cost(u) for u in units)
    parts = 1 if target != "cuda" else max(1, min(MAX_PARTS, round(total / GEMMS_PER_PART)))
    load = [PART0_COST] + [0.0] * (parts - 1)
    for unit in sorted(units, key=gemm_cost, reverse=True):   # stable: ties keep source order
        p = load.index(min(load))
        load[p] += gemm_cost(unit)
        for k in unit:
            k.values["part"] = p
    return parts


def next_batch_hook(train: list, plan, module, target: str = "cpu") -> dict | None:
    """Where the train step runs its caller's hook (runtime gc_hook; the trainer's next batch, gc_main.h):
    right after the last kernel that reads the labels y or writes the loss, on a stream of its own that
    waits for the streams those kernels ran on. The trainer's hook writes the next step's labels and rows
    (the other half of x's slot, plan_memory.rows_bytes: row indices, or the gathered values) and records this
    step's loss, so the next step's batch is ready before the step ends instead of a kernel ahead of it. Only
    where x is read
    through batch rows (a gathered x's buffer is read by the step until its end): {"after": kernel index,
    "mask": the streams' bits, "in_post": ...}, or None. in_post: where the trainer gathers the batches'
    values (plan_memory.gathered_rows) and the kernel right after is a chain's post kernel that follows every
    kernel that touches the labels or the loss (on its stream, or waiting for the event recorded after it),
    the cuda step gathers the next batch in that post kernel's own last blocks instead (a row a block,
    gc_next_rows): the next step's first kernel then follows the post kernel (programmatically where they
    share a stream) rather than waiting for the hook's stream (H100, logistic regression b128: see
    docs/compiler.md). The MLP at batch 128 has its post kernel on the other stream, beside dW1 (streams.heirs)."""
    trainer = module.trainer
    if not trainer or module.loss is None or not plan.buffer_of(trainer["x"]).rows:
        return None
    y, loss = plan.buffer_of(trainer["y"]), plan.buffer_of(module.loss)
    labels, lost = [(y.offset, y.offset + y.size)], [(loss.offset, loss.offset + loss.size)]
    touching = [i for i, k in enumerate(train)
                if overlap(k.reads + k.writes, labels) or overlap(k.writes, lost)]
    if not touching:
        return None
    after, streams = max(touching), {train[i].values.get("stream", 0) for i in touching}
    post = train[after + 1] if after + 1 < len(train) else None
    # the post kernel follows each of them: on its stream, or waiting for the event recorded after it
    follows = post is not None and all(train[i].values.get("stream", 0) == post.values.get("stream", 0) or
                                       train[i].values.get("record") in post.values.get("waits", [])
                                       for i in touching)
    in_post = target == "cuda" and gathered_rows(trainer["x"]) and follows and post.kind == "post"
    return {"after": after, "mask": sum(1 << s for s in streams), "in_post": in_post}


def rows_as_floats(kernels: list, target: str) -> bool:
    """Whether the cuda trainer gives the steps its uint8 images as floats (GC_X_FLOAT; gc_main.h,
    gc_upload_split: widened on the device, gc_widen_pixels): where a GEMM that reads them in place has an fp32
    pipelined or a wgmma tile, whose kernels copy float rows straight into shared memory and refuse uint8 ones
    (the mma.sync tensor-core pipeline reads both; the register-staged kernel's and a chain's or post kernel's
    row loads convert as they read)."""
    if target != "cuda":
        return False
    tiles = [Tile.parse(k.values["tile"])[0] for k in kernels if k.kind == "matmul" and k.values["rows"]]
    return any(tile.float_rows_only for tile in tiles)


def share_carveout(kernels: dict, target: str) -> None:
    """In a step with a GEMM on a short-K tensor-core tile (TF32 = 5 or 7: up to ~60 KB of shared memory a block,
    asking for the largest shared-memory carveout as every kernel with dynamic shared memory does), the fused and
    post kernels ask for it too (values["carveout"]). An SM's split of L1 and shared memory is set by the blocks
    it runs; a kernel without a preference beside that GEMM got SMs configured for its own small needs, and the
    GEMM's blocks waited for them to drain (H100, MLP b128 trainer, dW1 on such a tile beside the post kernel:
    23.5 us a step, 14.9 with the post kernel asking too). Chains keep the driver's choice: the b1000 chain
    reads W2 through L1 (every kernel with the largest carveout: 39.1 -> 47.0 us)."""
    if target != "cuda":
        return
    for ks in kernels.values():
        if any(k.kind == "matmul" and Tile.parse(k.values["tile"])[0].short_k for k in ks):
            for k in ks:
                if k.kind in ("fused", "post"):
                    k.values["carveout"] = True


def emit(module, plan, kernels, target: str, build_command) -> tuple[str, int]:
    """The program's source and how many kernels parts it has (assign_parts). build_command: the compile
    commands the header shows, or a function of the number of kernels parts that gives them."""
    env = environment()
    everything = [k for ks in kernels.values() for k in ks]
    share_epilogues(everything)   # in the order they are written
    parts = assign_parts(everything, target)
    if callable(build_command):
        build_command = build_command(parts)
    streams = {d: assign_streams(ks) if target == "cuda" else 1 for d, ks in kernels.items()}
    if target == "cuda":
        for ks in kernels.values():
            early_copies(ks)
    share_carveout(kernels, target)
    hook = next_batch_hook(kernels.get("train", []), plan, module, target)
    if hook and hook["in_post"]:   # the post kernel's last blocks gather the next batch
        x = module.trainer["x"]
        kernels["train"][hook["after"] + 1].values["next"] = {"batch": x.shape[0], "row": x.shape[1]}
    macros = {}
    for template in ("kernels_common.j2", f"kernels_{target}.j2"):
        mod = env.get_template(template).module
        macros.update({name: getattr(mod, name) for name in dir(mod) if not name.startswith("_")})

    offset = plan.offset_of  # everything in the tables lives in the persistent region

    layout = []
    for b in plan.buffers:
        n = b.node
        lifetime = "always" if b.region == "persistent" else f"{b.schedule}:{b.first}-{b.last}"
        what = f"{n.name} {tuple(n.shape)} {n.dtype} ({n.op})"
        if b.rows:
            what += (": two gathered batches; the GEMMs read the step's in place (gc_rows)" if gathered_rows(n) else
                     ": its row indices; the GEMMs read its values in place (gc_rows)")
        layout.append({"offset": b.offset, "size": b.size, "region": b.region, "lifetime": lifetime,
                       "what": what})
    for name, (start, size) in plan.workspaces.items():
        layout.append({"offset": start, "size": size, "region": "workspace", "lifetime": "always",
                       "what": f"{name}: {plan.workspace_notes[name]}"})

    read = module.eval_variables   # and the trained parameters the outputs do not read (a head the loss alone uses)
    variables = [tensor_row(v, offset(v), model=v.name in read or v.attrs.get("trainable", True))
                 for v in module.variables]
    train_inputs = [tensor_row(x, offset(x), classes=module.labels.get(x.name, 0)) for x in module.train_inputs]
    eval_inputs = [tensor_row(x, offset(x), classes=module.labels.get(x.name, 0)) for x in module.eval_inputs]
    eval_outputs = [tensor_row(o, offset(o), f"output '{name}' {tuple(o.shape)} {o.dtype}")
                    for name, o in module.outputs.items()]
    for row, name in zip(eval_outputs, module.outputs):
        row["name"] = c_text(name)

    trainer = module.trainer
    x_rows = bool(trainer) and plan.buffer_of(trainer["x"]).rows
    x_gathered = x_rows and gathered_rows(trainer["x"])
    defines = [
        ("GC_PROGRAM_NAME", json.dumps(module.name)),
        ("GC_SOURCE_NAME", json.dumps(module.source)),
        ("GC_TARGET_NAME", json.dumps(target)),
        ("GC_INIT_FILE_NAME", json.dumps(module.init_file)),
        ("GC_LAYOUT_HASH", f"0x{module.layout_hash:016x}ull"),
        ("GC_HAS_TRAIN_STEP", int(module.loss is not None)),
        ("GC_LOSS_OFFSET", offset(module.loss) if module.loss is not None else 0),
        ("GC_LOSS_F64", int(module.loss is not None and module.loss.dtype == "float64")),
        ("GC_HAS_LR", int(any(v.name == "lr" for v in module.variables))),
        ("GC_HAS_TRAINER", int(trainer is not None)),
        ("GC_NO_TRAINER", json.dumps(module.no_trainer)),
        ("GC_BATCH", module.batch_size),
        ("GC_X_OFFSET", offset(trainer["x"]) if trainer else 0),
        ("GC_X_ROWS", int(x_rows)),   # the GEMMs read x in place (gc_rows): its batch rows at GC_X_OFFSET
        ("GC_X_GATHERED", int(x_gathered)),   # ... two gathered batches of its values, not row indices
        ("GC_X_FLOAT", int(x_rows and not x_gathered and rows_as_floats(everything, target))),
        ("GC_Y_OFFSET", offset(trainer["y"]) if trainer else 0),
        ("GC_NEXT_BATCH", int(hook is not None)),   # the train step runs the trainer's next batch (gc_hook)
        ("GC_LOGITS_OFFSET", offset(trainer["logits"]) if trainer else 0),
        ("GC_ROW", trainer["x"].size // module.batch_size if trainer else 1),
        ("GC_CLASSES", trainer["logits"].shape[1] if trainer else 1),
    ]
    # last, after every offset this function asks for (a literal read through a pointer gets its slot then)
    constants = []
    placed = [(b.node, b.offset) for b in plan.buffers if b.node.op == "constant" and b.region == "persistent"]
    for n, at in placed + list(plan.literals.items()):
        flat = np.asarray(n.attrs["value"]).reshape(-1)
        constants.append({"ctype": C_TYPES[n.dtype], "offset": at, "nbytes": n.nbytes,
                          "data": ", ".join(c_literal(v, n.dtype) for v in flat),
                          "comment": f"{n.name} {tuple(n.shape)} {n.dtype}"})
    context = {
        "version": __version__, "source": module.source, "name": module.name, "target": target,
        "build_command": build_command,
        "runtime_head": runtime_parts(RUNTIME_HEAD + RUNTIME_KERNELS[target] + [RUNTIME_CONV]),
        "runtime_tail": runtime_parts(RUNTIME_TAIL),
        "arena_bytes": plan.arena_bytes, "persistent_bytes": plan.persistent_bytes,
        "lower_bound": plan.lower_bound, "naive_bytes": plan.naive_bytes, "layout": layout,
        "kernels": everything, "parts": parts, "K": macros,
        "train": kernels.get("train", []), "eval": kernels.get("eval", []),
        "train_streams": streams.get("train", 1), "eval_streams": streams.get("eval", 1), "train_hook": hook,
        "variables": variables, "train_inputs": train_inputs, "eval_inputs": eval_inputs,
        "eval_outputs": eval_outputs, "constants": constants, "defines": defines,
        "manifest_c_string": c_string(json.dumps(module.manifest, indent=1)), "mirrors": plan.mirrors,
    }
    return env.get_template("program.j2").render(**context), parts
