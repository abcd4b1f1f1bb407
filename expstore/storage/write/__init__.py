"""Write: the append path. Lane writers stage rows in shard buffers (in shared memory on a
local store), background threads write full shards, a flush commits the lane state;
``resume_writer`` reopens a lane, its partly written shard restored.
"""

from .background import FORKS, Background
from .lane_rows import LaneRows
from .resume import resume_writer
from .staging import ENABLED, StagedLanes, staging_path
from .step_plan import build_plan
from .writer import LaneWriter

__all__ = ["ENABLED", "FORKS", "Background", "LaneRows", "LaneWriter", "StagedLanes",
           "build_plan", "resume_writer", "staging_path"]
