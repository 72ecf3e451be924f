"""Pipeline schedules as data (issue #36), independent of any framework: ``schedule.build``
makes the action table every rank runs (GPipe, 1F1B, interleaved 1F1B, forward-only),
``schedule_check.check`` refuses a table that cannot run, with the reason, and
``schedule_check.simulate`` counts a step's bubble and activation memory. PyTorch runs the
tables in ``engine_native.torch.pipelining``.
"""
from engine_native.pipeline.schedule import (
                                             SCHEDULES,
                                             Action,
                                             Schedule,
                                             ScheduleError,
                                             build,
                                             ideal_bubble,
)
from engine_native.pipeline.schedule_check import StepCost, check, simulate

__all__ = ["SCHEDULES", "Action", "Schedule", "ScheduleError", "StepCost", "build", "check",
           "ideal_bubble", "simulate"]
