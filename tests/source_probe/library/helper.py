"""Stands for library code (torch, neuron_lab): frames the capture skips."""


def capture_from_library(probe):
    return probe.capture()


def nested(probe):
    return capture_from_library(probe)


def call_back(fn):
    return sorted([1], key=lambda _: fn())


def only_library_inner(probe):
    return probe.capture()  # ONLY_LIBRARY_LINE


ONLY_LIBRARY_LINE = 17


def only_library(probe):
    return only_library_inner(probe)
