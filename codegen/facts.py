"""What the CPU lowering passes (codegen.lower) and the C emitter both read about one kernel:
``Scop x strides x CpuTarget -> Facts``. The passes record their decisions in the loop IR; the
facts here are the inputs to those decisions (tensors, strides, the target) and the few decisions
that later passes consult while they decide (temporaries held outside memory, hoisted reads).
"""

from __future__ import annotations

from tcdsl.polyhedral.cputarget import GENERIC, CpuTarget
from tcdsl.polyhedral.loopir import LCall
from tcdsl.polyhedral.scop import Scop


class Facts:
    VECTOR_TILES = True  # explicit vector code where a loop or tile has that form (the GPU emitter has none)

    def __init__(self, scop: Scop, strides: dict[str, tuple[int, ...]], target: CpuTarget | None = None,
                 vectorize: bool = True, vector_math: bool = False, unroll: int = 0) -> None:
        self.scop = scop
        self.c = scop.inst.checked
        tensors = (*self.c.inputs, *self.c.outputs, *self.c.temps)
        self.order = tuple(t.name for t in tensors)
        self.tensors = {t.name: t for t in tensors}
        self.shapes = scop.inst.shapes
        self.strides = strides
        self.target = target or GENERIC
        self.vectorize = vectorize
        self.vector_math = vector_math and vectorize
        self.unroll = unroll  # the option: unroll loops of at most this many iterations
        self.contracted: set[str] = set()  # temporaries in one scalar (loopir.LDecl "scalar")
        self.rows: dict[str, tuple[int, ...]] = {}  # temporaries in one row buffer -> the dims fixed there
        self.scalars: set[str] | dict[str, str] = set()  # contracted temporaries in scope (the emitter: -> C name)
        self.hoisted: dict[int, str] = {}  # id(Read) -> the local loaded before the current loop
        self.gathered: dict[tuple[int, int], str] = {}  # (id(Read), dim) -> its checked row, before the loop
        self.packed: dict[int, str] = {}  # id(Read) -> its packed buffer's element, less the lane ("buf[... + ")
        self.pack_of: dict[LCall, tuple[int, str]] = {}  # the emitter: a tile's call -> its packed read, as above

    @property
    def in_memory(self) -> set[str]:
        """The tensors held in buffers of their full shape."""
        return set(self.order) - self.contracted - set(self.rows)
