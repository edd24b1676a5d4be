"""Operator controllers for the elastic-capacity tests (``rollout.elastic.controller``)."""


def lend_two(capacity) -> None:
    capacity.lend(2)
