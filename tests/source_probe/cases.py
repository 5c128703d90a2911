"""Source lines as the device captures them, in the frame situations each CPython lays out
differently; run by each supported interpreter (tests/device/test_source_lines.py).

Each case returns (captured, expected): captured is source_probe.capture()'s
(file, line, function), expected the same read from Python's own frames. Prints JSON.
"""

import asyncio
import json
import os
import sys
import threading

sys.path.insert(0, sys.argv[1])  # where source_probe was built
import source_probe  # noqa: E402

HERE = os.path.abspath(__file__)
LIBRARY = os.path.join(os.path.dirname(HERE), "library")
sys.path.insert(0, os.path.dirname(HERE))
source_probe.set_library_prefixes([LIBRARY + os.sep])
from library import helper  # noqa: E402


def here(depth: int = 1) -> tuple[str, int, str]:
    frame = sys._getframe(depth)
    return (os.path.abspath(frame.f_code.co_filename), frame.f_lineno, frame.f_code.co_name)


cases = {}


def case(fn):
    cases[fn.__name__] = fn
    return fn


@case
def in_a_function():
    got = source_probe.capture(); want = here()  # noqa: E702 - one line on purpose
    return got, want


@case
def through_library_code():
    got = helper.capture_from_library(source_probe); want = here()  # noqa: E702
    return got, want


@case
def through_two_library_frames():
    got = helper.nested(source_probe); want = here()  # noqa: E702
    return got, want


@case
def in_a_list_comprehension():  # inlined into the function on 3.12+
    return [(source_probe.capture(), here()) for _ in range(1)][0]


@case
def in_a_generator_expression():
    return next((source_probe.capture(), here()) for _ in range(1))


@case
def in_a_resumed_generator():
    def gen():
        yield None
        yield source_probe.capture(), here()

    g = gen()
    next(g)
    return next(g)


@case
def called_back_from_c():  # sorted() calls the key from C: an entry frame on 3.12+
    out = []
    sorted([1], key=lambda _: out.append((source_probe.capture(), here())))
    return out[0]


@case
def called_back_from_c_inside_library_code():
    out = []
    helper.call_back(lambda: out.append((source_probe.capture(), here())))
    return out[0]


@case
def library_code_called_from_c_directly():
    got = max(map(helper.capture_from_library, [source_probe])); want = here()  # noqa: E702
    return got, want


@case
def in_a_coroutine():
    async def work():
        await asyncio.sleep(0)
        return source_probe.capture(), here()

    return asyncio.run(work())


@case
def in_another_thread():
    out = []
    t = threading.Thread(target=lambda: out.append((source_probe.capture(), here())))
    t.start()
    t.join()
    return out[0]


@case
def only_library_code():  # no user frame left: the innermost (library) frame
    source_probe.set_library_prefixes([LIBRARY + os.sep, os.path.dirname(HERE) + os.sep, os.path.dirname(os.__file__)])
    try:
        got = helper.only_library(source_probe)
    finally:
        source_probe.set_library_prefixes([LIBRARY + os.sep])
    return got, (os.path.join(LIBRARY, "helper.py"), helper.ONLY_LIBRARY_LINE, "only_library_inner")


@case
def after_an_exception_was_handled():
    try:
        raise ValueError
    except ValueError:
        pass
    got = source_probe.capture(); want = here()  # noqa: E702
    return got, want


def main() -> None:
    report = {}
    for name, fn in cases.items():
        got, want = fn()
        got = None if got is None else [os.path.abspath(got[0]), got[1], got[2]]
        report[name] = {"captured": got, "expected": list(want)}
    # 200 captures of the same line return the same answer (the caches agree with the walk).
    lines = {tuple(source_probe.capture()) for _ in range(200)}
    report["repeated"] = {"captured": len(lines), "expected": 1}
    print(json.dumps({"python": list(sys.version_info[:3]), "cases": report}))


main()
