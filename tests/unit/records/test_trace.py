"""A pipeline stage's op names, built and read back by one enum (and handed to the
training page's script as a span's args), and the one bubble definition that the
step's result and the training page both use."""

from __future__ import annotations

import pytest

from dagtrain.records.trace import Op, bubble, op_args, parse_op


@pytest.mark.parametrize("op", list(Op))
def test_every_op_name_reads_back_as_its_kind_and_microbatch(op):
    assert parse_op(op(12)) == (op, 12)


@pytest.mark.parametrize("name", ["load-next", "allreduce[0]", "update", "F", "Fx1", "B1a"])
def test_other_tasks_are_not_pipeline_ops(name):
    assert parse_op(name) is None


def test_an_ops_args_say_its_kind_microbatch_and_a_transfers_way():
    assert op_args("F3") == {"op": "F", "microbatch": 3}
    assert op_args(Op.WEIGHT(0)) == {"op": "W", "microbatch": 0}
    assert op_args("recv-grad12") == {
        "op": "recv-grad",
        "microbatch": 12,
        "way": "recv",
        "carries": "grad",
    }
    assert op_args(Op.SEND_ACT(1)) == {
        "op": "send-act",
        "microbatch": 1,
        "way": "send",
        "carries": "act",
    }
    assert op_args("update") == op_args("allreduce[0]") == op_args("forward-backward") == {}


def test_the_bubble_is_the_share_of_the_span_without_compute_overlaps_counted_once():
    ops = [
        ("recv-act0", 0.0, 2.0),  # waiting: not compute, but part of the span
        ("F0", 2.0, 4.0),
        ("B0", 3.0, 5.0),  # overlaps F0 by 1: busy 2..5 counted once
        ("send-grad0", 5.0, 8.0),
        ("W0", 8.0, 10.0),
    ]
    share, busy, span = bubble(ops)
    assert (busy, span) == (5.0, 10.0) and share == pytest.approx(0.5)
    assert bubble([("update", 0.0, 1.0)]) is None  # no F/B/W: not a pipeline step
    assert bubble([("F0", 1.0, 1.0)]) is None  # an empty span
