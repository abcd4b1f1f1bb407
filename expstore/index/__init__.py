"""In-memory indices: the row index and the priority sum-tree."""

from .sumtree import PriorityTree

__all__ = ["PriorityTree"]
