"""``extract_failures``: pytest and unittest reports read into stable failure fields.

Every test report read here is real: the module fixture writes a tiny package with bugs and
its tests into temporary directories and runs them with pytest (in several report styles) and
unittest in subprocesses, in parallel. Only the fuzzing input and the outputs that are not test
reports are written by hand.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyloop.tools import ToolEnvironment
from polyloop.tools.builtin import TestReport, extract_failures, workspace_tools
from polyloop.types import Action, ActionStatus, Failure, Outcome, ToolContext

# --- the project under test ---------------------------------------------------------------------

ORDERS = """\
import os
import time


class OrderError(Exception):
    pass


class Order:
    def __init__(self, number, status, items):
        self.number = number
        self.status = status
        self.items = list(items)


STOCK = {"apple": 3}


def cancel(order):
    if order.status == "CANCELLED":
        raise OrderError(f"order {order.number} is already cancelled")
    if order.status == "PAID":
        raise OrderError(f"order {order.number} is paid")  # bug: paid orders may be cancelled
    for item in order.items:
        STOCK[item] -= 1  # bug: the items should go back to stock
    order.status = "CANCELLED"
    return order


def price(item):
    return {"apple": 3}[item]


def archive(order, directory):
    started = time.perf_counter()
    path = os.path.join(directory, f"order-{order.number}.json")
    if not os.path.exists(path):
        took = time.perf_counter() - started
        raise FileNotFoundError(f"{order!r} has no archive at {path} (looked {took:.6f}s)")
    return path
"""

TEST_ORDERS = """\
import tempfile
import unittest

from shop.orders import STOCK, Order, archive, cancel, price


class CancelOrderTest(unittest.TestCase):
    def test_cancel_returns_the_items_to_stock(self):
        before = STOCK["apple"]
        cancel(Order(7, "PENDING", ["apple"]))
        self.assertEqual(STOCK["apple"], before + 1)

    def test_a_paid_order_can_be_cancelled(self):
        order = cancel(Order(8, "PAID", []))
        self.assertEqual(order.status, "CANCELLED")

    def test_price(self):
        self.assertEqual(price("pear"), 2)

    def test_archive(self):
        archive(Order(9, "CANCELLED", []), tempfile.mkdtemp())

    def test_a_pending_order_can_be_cancelled(self):
        self.assertEqual(cancel(Order(10, "PENDING", [])).status, "CANCELLED")


def test_plain_assert():
    assert price("apple") == 2
"""

CONFTEST = """\
import pytest


@pytest.fixture
def database():
    raise ConnectionError("database is down")
"""

# No pytest import: unittest imports this module too, and should start fast.
TEST_FIXTURES = """\
def test_uses_the_database(database):
    pass
"""

TEST_BROKEN = """\
from shop.orders import refund


def test_refund():
    assert refund
"""

TEST_PASSING = """\
import unittest


class PassingTest(unittest.TestCase):
    def test_fine(self):
        self.assertEqual(1 + 1, 2)
"""


def line_of(source: str, text: str) -> int:
    """The 1-based number of the only line of ``source`` that contains ``text``."""
    numbers = [i for i, line in enumerate(source.splitlines(), 1) if text in line]
    assert len(numbers) == 1, (text, numbers)
    return numbers[0]


PAID = f"shop/orders.py:{line_of(ORDERS, 'is paid')}"
ARCHIVE = f"shop/orders.py:{line_of(ORDERS, 'raise FileNotFoundError')}"
PRICE = f"shop/orders.py:{line_of(ORDERS, 'return {')}"
STOCK_ASSERT = f"tests/test_orders.py:{line_of(TEST_ORDERS, 'before + 1')}"
PLAIN_ASSERT = f"tests/test_orders.py:{line_of(TEST_ORDERS, 'assert price')}"
DATABASE = f"tests/conftest.py:{line_of(CONFTEST, 'raise ConnectionError')}"

PYTEST_CLASS = "tests/test_orders.py::CancelOrderTest"
UNITTEST_CLASS = "tests.test_orders.CancelOrderTest"


def write_project(root: Path, tests: dict[str, str]) -> Path:
    (root / "shop").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "shop" / "__init__.py").write_text("")
    (root / "shop" / "orders.py").write_text(ORDERS)
    (root / "tests" / "__init__.py").write_text("")
    for name, text in tests.items():
        (root / "tests" / name).write_text(text)
    (root / "pytest.ini").write_text("[pytest]\n")  # the project is pytest's rootdir
    return root


FAILING = {
    "test_orders.py": TEST_ORDERS,
    "test_fixtures.py": TEST_FIXTURES,
    "conftest.py": CONFTEST,
}

# Plugins from the environment would slow the runs down and could change the report.
ENV = {
    **{k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PY_COLORS"))},
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "COLUMNS": "80",
    "TMPDIR": "/tmp",
}
PYTEST = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
UNITTEST = [sys.executable, "-m", "unittest"]


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str

    @property
    def report(self) -> TestReport:
        report = extract_failures(self.output)
        assert report is not None, self.output
        return report


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("reports")
    return {
        "a": write_project(base / "a", FAILING),
        "b": write_project(base / "checkout-b", FAILING),
        "broken": write_project(base / "broken", {"test_broken.py": TEST_BROKEN}),
        "passing": write_project(base / "passing", {"test_passing.py": TEST_PASSING}),
    }


@pytest.fixture(scope="module")
def runs(projects: dict[str, Path]) -> dict[str, Run]:
    commands = {
        "pytest -q": ("a", [*PYTEST, "-q"]),
        "pytest": ("a", PYTEST),
        "pytest -v --tb=short --color=yes": ("a", [*PYTEST, "-v", "--tb=short", "--color=yes"]),
        "pytest -q --tb=line": ("a", [*PYTEST, "-q", "--tb=line"]),
        "pytest -q --tb=no": ("a", [*PYTEST, "-q", "--tb=no"]),
        "unittest": ("a", UNITTEST),
        "unittest -v": ("a", [*UNITTEST, "-v"]),
        "b: pytest -q": ("b", [*PYTEST, "-q"]),
        "b: unittest": ("b", UNITTEST),
        "broken: pytest": ("broken", PYTEST),
        "broken: unittest": ("broken", UNITTEST),
        "passing: pytest -q": ("passing", [*PYTEST, "-q"]),
        "passing: unittest": ("passing", UNITTEST),
    }
    started = {
        name: subprocess.Popen(
            argv,
            cwd=projects[project],
            env=ENV,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (project, argv) in commands.items()
    }
    done = {}
    for name, process in started.items():
        output, _ = process.communicate(timeout=60)
        done[name] = Run(process.returncode, output)
    return done


def fields(failure: Failure) -> tuple[str | None, str | None, str | None]:
    return failure.check, failure.error_type, failure.top_frame


# --- pytest ---------------------------------------------------------------------------------------


def test_pytest_q_reads_every_failure_in_order(runs: dict[str, Run]) -> None:
    run = runs["pytest -q"]
    assert run.returncode == 1
    report = run.report
    assert report.framework == "pytest"
    assert [fields(f) for f in report.failures] == [
        (f"{PYTEST_CLASS}::test_a_paid_order_can_be_cancelled", "OrderError", PAID),
        (f"{PYTEST_CLASS}::test_archive", "FileNotFoundError", ARCHIVE),
        (f"{PYTEST_CLASS}::test_cancel_returns_the_items_to_stock", "AssertionError", STOCK_ASSERT),
        (f"{PYTEST_CLASS}::test_price", "KeyError", PRICE),
        ("tests/test_orders.py::test_plain_assert", "AssertionError", PLAIN_ASSERT),
        # errors come after the failed tests
        ("tests/test_fixtures.py::test_uses_the_database", "ConnectionError", DATABASE),
    ]
    messages = [f.message for f in report.failures]
    assert messages[0] == "order 8 is paid"
    assert messages[1] is not None
    assert messages[1].startswith("<shop.orders.Order object at 0x")
    assert messages[2:] == ["2 != 4", "'pear'", "assert 3 == 2", "database is down"]
    assert report.representative == report.failures[0]
    assert report.summary.startswith("5 failed, 1 passed, 1 error in ")


def test_every_pytest_report_style_gives_the_same_failures(runs: dict[str, Run]) -> None:
    expected = runs["pytest -q"].report.failures
    for name in ["pytest", "pytest -v --tb=short --color=yes", "pytest -q --tb=line"]:
        got = runs[name].report.failures
        want = expected
        assert [f.check for f in got] == [f.check for f in want], name
        if name == "pytest -q --tb=line":
            # one crash line per failure: inside unittest for its assertions, none for errors
            assert [f.top_frame for f in got] == [PAID, ARCHIVE, None, PRICE, PLAIN_ASSERT, None]
            got = tuple(dataclasses.replace(f, top_frame=None) for f in got)
            want = tuple(dataclasses.replace(f, top_frame=None) for f in want)
        # the archive message holds an address, a temporary path and a timing of its run
        assert [f.fingerprint() for f in got] == [f.fingerprint() for f in want], name


def test_a_report_without_tracebacks_still_names_the_failures(runs: dict[str, Run]) -> None:
    report = runs["pytest -q --tb=no"].report
    assert [f.check for f in report.failures] == [
        f.check for f in runs["pytest -q"].report.failures
    ]
    assert all(f.top_frame is None for f in report.failures)
    # read from "FAILED <id> - KeyError: 'pear'" (pytest cuts long lines to the terminal width)
    price = report.failures[3]
    assert (price.error_type, price.message) == ("KeyError", "'pear'")


def test_pytest_collection_errors(runs: dict[str, Run]) -> None:
    run = runs["broken: pytest"]
    assert run.returncode == 2
    assert run.report.failures == (
        Failure(
            check="tests/test_broken.py",
            error_type="ImportError",
            top_frame="tests/test_broken.py:1",
            # the project root is taken out of paths in the message
            message="cannot import name 'refund' from 'shop.orders' (shop/orders.py)",
        ),
    )
    assert run.report.summary.startswith("1 error in ")


# --- unittest -------------------------------------------------------------------------------------


def test_unittest_reads_failures_then_errors(runs: dict[str, Run]) -> None:
    for name in ("unittest", "unittest -v"):
        run = runs[name]
        assert run.returncode == 1
        report = run.report
        assert report.framework == "unittest"
        assert [fields(f) for f in report.failures] == [
            (
                f"{UNITTEST_CLASS}.test_cancel_returns_the_items_to_stock",
                "AssertionError",
                STOCK_ASSERT,
            ),
            (f"{UNITTEST_CLASS}.test_a_paid_order_can_be_cancelled", "OrderError", PAID),
            (f"{UNITTEST_CLASS}.test_archive", "FileNotFoundError", ARCHIVE),
            (f"{UNITTEST_CLASS}.test_price", "KeyError", PRICE),
        ], name
        assert report.failures[0].message == "2 != 4"
        assert report.representative == report.failures[0]
        assert report.summary.startswith("Ran 5 tests in ")
        assert report.summary.endswith(": FAILED (failures=1, errors=3)")


def test_unittest_import_errors(runs: dict[str, Run]) -> None:
    report = runs["broken: unittest"].report
    assert report.failures == (
        Failure(
            check="tests.test_broken",
            error_type="ImportError",
            top_frame="tests/test_broken.py:1",
            message="cannot import name 'refund' from 'shop.orders' (shop/orders.py)",
        ),
    )


# --- fingerprints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "second"), [("pytest -q", "b: pytest -q"), ("unittest", "b: unittest")]
)
def test_two_runs_of_the_same_suite_give_the_same_fingerprints(
    runs: dict[str, Run], first: str, second: str
) -> None:
    one, two = runs[first].report, runs[second].report
    assert [f.fingerprint() for f in one.failures] == [f.fingerprint() for f in two.failures]
    # ... although the runs differ: another checkout, another address, temporary directory
    # and timing in the archive failure's message, another run time
    archive = next(i for i, f in enumerate(one.failures) if (f.check or "").endswith("archive"))
    assert one.failures[archive].message != two.failures[archive].message
    assert runs[first].output != runs[second].output


@pytest.mark.parametrize("name", ["pytest -q", "unittest", "pytest -q --tb=line"])
def test_different_failing_tests_give_different_fingerprints(
    runs: dict[str, Run], name: str
) -> None:
    fingerprints = [f.fingerprint() for f in runs[name].report.failures]
    assert len(set(fingerprints)) == len(fingerprints) > 1


# --- not a failing report -------------------------------------------------------------------------


def test_passing_runs_are_reports_without_failures(runs: dict[str, Run]) -> None:
    pytest_report = runs["passing: pytest -q"].report
    assert pytest_report.framework == "pytest"
    assert pytest_report.failures == ()
    assert pytest_report.representative is None
    assert pytest_report.summary.startswith("1 passed in ")
    unit = runs["passing: unittest"].report
    assert (unit.framework, unit.failures, unit.representative) == ("unittest", (), None)
    assert unit.summary.startswith("Ran 1 test in ") and unit.summary.endswith(": OK")


@pytest.mark.parametrize(
    "output",
    [
        "",
        "make: *** [Makefile:3: all] Error 2\n",
        "ls: cannot access 'missing': No such file or directory\n",
        'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
        "    1/0\nZeroDivisionError: division by zero\n",
    ],
)
def test_other_output_is_not_a_report(output: str) -> None:
    assert extract_failures(output) is None


# --- odd input ------------------------------------------------------------------------------------

TRICKY = [
    "=" * 70,
    "-" * 70,
    "=== FAILURES ===",
    "=== ERRORS ===",
    "=== short test summary info ===",
    "=== test session starts ===",
    "___ t ___",
    "_ _ _ _",
    "___  ___",
    "E",
    "E   ",
    'E     File "x.py", line 99999999999999',
    "E   assert",
    "FAILED ",
    "FAILED a::b - ",
    "FAILED a::b[ - x",
    "SUBFAILED() a::b",
    "ERROR collecting ",
    "ERROR at setup of ",
    "FAIL: ",
    "ERROR: x (y)",
    "FAIL: t (unittest.loader._FailedTest)",
    "Ran 1 test in 0.1s",
    "OK",
    "FAILED (failures=1)",
    "Traceback (most recent call last):",
    '  File "", line 1',
    '  File "/a/b.py", line 2, in f',
    "x.py:1:",
    "x.py:1: in",
    "/x.py:1: KeyError",
    "<frozen x>:1: in y",
    "file x, line 2",
    "rootdir: /",
    "rootdir: ",
    "ImportError while importing test module '/'.",
    "The above exception was the direct cause of the following exception:",
    "1 failed in 0.1s",
    "no tests ran in 0.01s",
    "---- Captured stdout call ----",
    "\x1b[31mE   KeyError\x1b[0m",
    ".:1: .",
    "a::b FAILED [ 50%]",
    "KeyError:",
    ":",
    "",
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text())
def test_any_text_is_read_without_raising(text: str) -> None:
    result = extract_failures(text)
    assert result is None or isinstance(result, TestReport)


@pytest.fixture(scope="module")
def real_lines(runs: dict[str, Run]) -> list[str]:
    return sorted({line for run in runs.values() for line in run.output.splitlines()})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shuffled_report_lines_are_read_without_raising(
    real_lines: list[str], data: st.DataObject
) -> None:
    lines = data.draw(
        st.lists(
            st.one_of(st.sampled_from(real_lines), st.sampled_from(TRICKY), st.text(max_size=30)),
            max_size=80,
        )
    )
    result = extract_failures("\n".join(lines))
    assert result is None or isinstance(result, TestReport)
    if result is not None:
        for failure in result.failures:
            assert isinstance(failure.fingerprint(), str)
            assert failure.message is None or len(failure.message) <= 200


@given(data=st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_cut_reports_are_read_without_raising(runs: dict[str, Run], data: st.DataObject) -> None:
    output = runs[data.draw(st.sampled_from(sorted(runs)))].output
    start = data.draw(st.integers(0, len(output)))
    end = data.draw(st.integers(start, len(output)))
    extract_failures(output[:start] + output[end:])


def test_long_hostile_lines_are_read_quickly() -> None:
    hostile = "\n".join(
        [
            "a::" * 20_000 + " FAILED",
            "1 passed in 1s" + " " * 50_000 + "x",
            "= " + "=" * 50_000 + "x =",
            "E   " + "a." * 50_000,
            "_ " * 50_000,
            "FAILED x[" + "]" * 50_000 + " y",
            "=== FAILURES ===",
            "x.py:" + "1:" * 50_000,
            "/" + "lib/python3/" * 10_000 + "test_x.py:1: in f",
        ]
    )
    started = time.monotonic()
    extract_failures(hostile * 5)
    assert time.monotonic() - started < 2


# --- the shell tool -------------------------------------------------------------------------------

CTX = ToolContext("run-1", 0, "op-1")
SHELL_ENV = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 COLUMNS=80 TMPDIR=/tmp"
needs_bash = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


async def shell(root: Path, command: str, **kw: Any) -> Outcome:
    env = ToolEnvironment(workspace_tools(root, **kw))
    return await env.execute(Action(command, "shell", {"command": command}), CTX)


@needs_bash
@pytest.mark.parametrize(
    ("argv", "check"),
    [
        ([*PYTEST, "-q"], f"{PYTEST_CLASS}::test_a_paid_order_can_be_cancelled"),
        (UNITTEST, f"{UNITTEST_CLASS}.test_cancel_returns_the_items_to_stock"),
    ],
)
async def test_the_shell_tool_sets_the_failures_of_a_failing_test_run(
    projects: dict[str, Path], argv: list[str], check: str
) -> None:
    outcome = await shell(projects["a"], f"{SHELL_ENV} {' '.join(argv)}")
    report = extract_failures(outcome.observation)
    assert report is not None
    assert outcome.failure is not None
    assert outcome.failure == report.representative
    assert outcome.failure.check == check
    # every failing test, in the report's order: the failure guard reads the whole set
    assert outcome.failures == outcome.failing == report.failures
    assert len(outcome.failures) > 1
    # the observation is the output and the exit code, as for any other command
    assert outcome.status is ActionStatus.executed
    assert outcome.observation.endswith("\n[exit code 1]")
    assert not outcome.synthetic


def saved(projects: dict[str, Path], runs: dict[str, Run], name: str) -> str:
    """A shell command that prints the output of a real run again, from a file."""
    path = projects["a"].parent / (name.replace(" ", "_").replace(":", "") + ".txt")
    path.write_text(runs[name].output)
    return f"cat {path}"


@needs_bash
async def test_a_cut_test_report_still_gives_its_first_failure(
    projects: dict[str, Path], runs: dict[str, Run]
) -> None:
    command = f"{saved(projects, runs, 'pytest')}; exit 1"
    # the head keeps the first failed test's entry; the cut goes through the next ones
    outcome = await shell(projects["a"], command, max_output_chars=4000)
    assert outcome.truncated_chars > 0
    expected = runs["pytest"].report.representative
    assert expected is not None
    assert outcome.failure is not None
    assert outcome.failure.fingerprint() == expected.fingerprint()


@needs_bash
@pytest.mark.parametrize(
    ("command", "timeout_s"),
    [
        ("ls missing-file", 5),  # fails, but prints no test report
        ("{failing}", 5),  # a failing report, but the command exits 0
        ("{passing}; exit 1", 5),  # exits 1, but the report has no failures
        ("{failing}; sleep 30", 0.5),  # a failing report, then the timeout
        ("{failing}; kill -TERM $$", 5),  # a failing report, then a signal
    ],
)
async def test_other_commands_get_no_failure(
    projects: dict[str, Path], runs: dict[str, Run], command: str, timeout_s: float
) -> None:
    command = command.format(
        failing=saved(projects, runs, "pytest -q"),
        passing=saved(projects, runs, "passing: pytest -q"),
    )
    outcome = await shell(projects["a"], command, shell_timeout_s=timeout_s)
    assert outcome.failure is None and outcome.failing == ()
    assert not outcome.observation.startswith("Error")
