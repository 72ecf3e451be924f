"""A pipeline step's error names the stage at fault when the core's cause names only its rank
(engine_native/torch/pipelining/step_run.py, stages_of_ranks_named): a stopped stage 0 reaches
stage 2 as "rank 0 (pid N) is stopped" inside the hang-up of stage 1. The real-rank check of
the same case is benchmarks/bench_pipeline_faults.py --stage 0 --cases stop."""
import types

import pytest

step_run = pytest.importorskip("engine_native.torch.pipelining.step_run")


def _pipeline(ranks, num_stages):
    return types.SimpleNamespace(num_stages=num_stages,
                                 rank_of=lambda s: ranks[s % len(ranks)])


STOPPED_RANK_0 = ("recv from rank 1 (tag 1099511627788): lost connection to rank 1: the process "
                  "exited or closed the connection; rank 0 (pid 4242) is stopped (SIGSTOP or "
                  "a debugger), so it relays no cause")


def test_a_rank_the_cause_names_is_given_its_stage_unless_already_named():
    three = _pipeline([0, 1, 2], 3)
    assert step_run.stages_of_ranks_named(STOPPED_RANK_0, three, {2, 1}) == \
        "; rank 0 holds stage 0"
    assert step_run.stages_of_ranks_named(STOPPED_RANK_0, three, {2}) == \
        "; rank 0 holds stage 0; rank 1 holds stage 1"
    assert step_run.stages_of_ranks_named(STOPPED_RANK_0, three, {0, 1, 2}) == ""
    assert step_run.stages_of_ranks_named("injected fault", three, {1}) == ""
    relayed = ("recv from rank 1 (tag 7): aborted on rank 0: pipeline stage 0 (rank 0) failed "
               "in the forward of micro-batch 2: RuntimeError: injected fault")
    assert step_run.stages_of_ranks_named(relayed, three, {2, 1}) == ""  # its own words say it
    again = STOPPED_RANK_0 + "; rank 0 holds stage 0"  # a PipelineError passed on once more
    assert step_run.stages_of_ranks_named(again, three, {2, 1}) == ""
    assert step_run.stages_of_ranks_named("set rank 0 could not make an NCCL unique id; local "
                                          "rank 1 is busy", three, {2}) == ""  # not global


def test_interleaved_ranks_list_every_stage_and_ranks_outside_the_pipeline_none():
    interleaved = _pipeline([3, 5], 4)  # a process set of ranks 3 and 5, two stages each
    text = "lost connection to rank 5; rank 3 (pid 1) is stopped; rank 12 and rank 50 hung up"
    assert step_run.stages_of_ranks_named(text, interleaved, {3}) == "; rank 5 holds stages 1, 3"
    assert step_run.stages_of_ranks_named(text, interleaved, set()) == \
        "; rank 3 holds stages 0, 2; rank 5 holds stages 1, 3"
