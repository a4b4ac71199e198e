"""Graph walk: find the nodes of a captured CUDA graph that read scheduler-shared buffers.

Used for derived placement (add the read-done node after exactly those readers) and for the
self-check of a planted marker (every reader must precede it). `model` and `analysis` are pure
Python (tested on CPU with hand-made graphs); `cuda` reads real graphs through cuda-bindings;
`plant` holds the two entry points a runner calls. Nothing here imports torch.
"""

from warpolicy.runtime.graphwalk.analysis import (
    DerivedPlan,
    Outcome,
    Reader,
    ancestors,
    derive_plan,
    find_event_record,
    find_readers,
    late_readers,
    reader_frontier,
)
from warpolicy.runtime.graphwalk.errors import (
    BindingsMissingError,
    CudaCallError,
    GraphWalkError,
    PlacementError,
)
from warpolicy.runtime.graphwalk.model import BufferRange, Graph, Node, NodeKind, buffer_ranges
from warpolicy.runtime.graphwalk.plant import (
    DerivedPlant,
    RawGraph,
    SelfCheck,
    check_marker,
    derive_and_plant,
)

__all__ = [
    "BindingsMissingError",
    "BufferRange",
    "CudaCallError",
    "DerivedPlan",
    "DerivedPlant",
    "Graph",
    "GraphWalkError",
    "Node",
    "NodeKind",
    "Outcome",
    "PlacementError",
    "RawGraph",
    "Reader",
    "SelfCheck",
    "ancestors",
    "buffer_ranges",
    "check_marker",
    "derive_and_plant",
    "derive_plan",
    "find_event_record",
    "find_readers",
    "late_readers",
    "reader_frontier",
]
