"""In-memory indices: the row index, the priority sum-tree and the priorities over it."""

from .priorities import PriorityIndex, to_numpy
from .rows import Listener, RowIndex
from .sumtree import PriorityTree

__all__ = ["Listener", "PriorityIndex", "PriorityTree", "RowIndex", "to_numpy"]
