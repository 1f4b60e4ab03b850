"""Compiler passes, one per module, in pipeline order: simplify, fuse, schedule, plan_memory (then lower,
emit).

Each pass takes the IR (output nodes, or a schedule of nodes) and returns the next form of it; the module
docstring says what the pass does and what it leaves to later passes."""
from .fuse import fuse  # noqa: F401
from .plan_memory import MemoryPlan, check_plan, plan_memory  # noqa: F401
from .schedule import schedule  # noqa: F401
from .simplify import simplify  # noqa: F401
