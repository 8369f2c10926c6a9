"""The tool registry: schemas from signatures and docstrings, registration errors, dispatch."""

from __future__ import annotations

import asyncio
import enum
import functools
import socket
import threading
from typing import Annotated, Any

import pydantic
import pytest

from polyloop.tools import Tool, ToolEnvironment, ToolRegistry
from polyloop.types import Action, ConfigError, Outcome, ReplayPolicy, ToolContext, canonical_json


class Color(enum.Enum):
    red = "red"
    blue = "blue"


class Address(pydantic.BaseModel):
    street: str
    title: str = "home"


class Person(pydantic.BaseModel):
    name: str
    address: Address
    tags: list[str] = []


def _walk(node: Any) -> list[tuple[str, Any]]:
    """Every (key, value) pair in a JSON structure, depth first."""
    pairs: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            pairs.append((key, value))
            pairs.extend(_walk(value))
    elif isinstance(node, list):
        for item in node:
            pairs.extend(_walk(item))
    return pairs


def _parameters(registry: ToolRegistry, name: str) -> dict[str, Any]:
    tool = registry.get(name)
    assert tool is not None
    return dict(tool.spec["function"]["parameters"])


def test_simple_tool_spec_is_openai_function_format() -> None:
    registry = ToolRegistry()

    @registry.tool
    def read_file(path: str, limit: int = 100) -> str:
        """Read a UTF-8 text file from the workspace."""
        return path

    assert registry.specs() == (
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a UTF-8 text file from the workspace.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "path": {"type": "string"},
                        "limit": {"type": "integer", "default": 100},
                    },
                    "required": ["path"],
                    "additionalProperties": False,
                },
            },
        },
    )


def test_nested_model_enum_and_optional_default_schema() -> None:
    registry = ToolRegistry()

    @registry.tool
    def save(person: Person, color: Color = Color.blue, note: str | None = None) -> str:
        """Save a person."""
        return "ok"

    params = _parameters(registry, "save")
    assert params["required"] == ["person"]
    assert params["properties"]["person"] == {"$ref": "#/$defs/Person"}
    assert params["properties"]["color"] == {"$ref": "#/$defs/Color", "default": "blue"}
    assert params["properties"]["note"] == {
        "anyOf": [{"type": "string"}, {"type": "null"}],
        "default": None,
    }
    defs = params["$defs"]
    assert defs["Color"] == {"enum": ["red", "blue"], "type": "string"}
    assert defs["Person"]["properties"]["address"] == {"$ref": "#/$defs/Address"}
    assert defs["Person"]["required"] == ["name", "address"]
    # A field *named* title survives; the "title" keyword is gone everywhere.
    assert defs["Address"]["properties"]["title"] == {"default": "home", "type": "string"}
    titles = [v for k, v in _walk(params) if k == "title" and isinstance(v, str)]
    assert titles == []


def test_parameter_named_title_and_default_with_title_key_are_kept() -> None:
    registry = ToolRegistry()

    @registry.tool
    def post(title: str, meta: dict[str, str] | None = None) -> str:
        """Post something."""
        return title

    @registry.tool
    def post2(meta: dict[str, str] = {"title": "x"}) -> str:  # noqa: B006
        """Post with a default."""
        return "ok"

    assert _parameters(registry, "post")["properties"]["title"] == {"type": "string"}
    assert _parameters(registry, "post")["required"] == ["title"]
    assert _parameters(registry, "post2")["properties"]["meta"]["default"] == {"title": "x"}


def test_description_is_first_paragraph_and_args_section_describes_parameters() -> None:
    registry = ToolRegistry()

    @registry.tool
    def grep(pattern: str, path: str = ".", ignore_case: bool = False) -> str:
        """Search files for a pattern,
        line by line.

        More detail the model does not need.

        Args:
            pattern (str): a Python regular expression,
                matched per line.
            path: where to search.

        Returns:
            The matching lines.
        """
        return pattern

    tool = registry.get("grep")
    assert tool is not None
    assert tool.description == "Search files for a pattern, line by line."
    props = _parameters(registry, "grep")["properties"]
    assert props["pattern"]["description"] == "a Python regular expression, matched per line."
    assert props["path"]["description"] == "where to search."
    assert "description" not in props["ignore_case"]


def test_annotated_field_description_is_used() -> None:
    registry = ToolRegistry()

    @registry.tool
    def f(n: Annotated[int, pydantic.Field(description="how many", ge=1)]) -> str:
        """Do n things."""
        return str(n)

    assert _parameters(registry, "f")["properties"]["n"] == {
        "type": "integer",
        "description": "how many",
        "minimum": 1,
    }


@pytest.mark.parametrize("annotation", ["plain", "optional"])
async def test_tool_context_is_injected_and_not_in_schema(annotation: str) -> None:
    registry = ToolRegistry()
    seen: list[ToolContext | None] = []

    if annotation == "plain":

        @registry.tool(replay="idempotent")
        def put(key: str, ctx: ToolContext) -> str:
            """Store a key.

            Args:
                key: the key.
                ctx: injected.
            """
            seen.append(ctx)
            return key

    else:

        @registry.tool(replay="idempotent")
        def put(key: str, ctx: ToolContext | None = None) -> str:
            """Store a key."""
            seen.append(ctx)
            return key

    params = _parameters(registry, "put")
    assert list(params["properties"]) == ["key"]
    assert params["required"] == ["key"]
    ctx = ToolContext("run-1", 3, "op-7")
    outcome = await ToolEnvironment(registry).execute(Action("put", "put", {"key": "k"}), ctx)
    assert outcome.observation == "k"
    assert seen == [ctx]


def test_decorator_bare_and_called_return_the_original_function() -> None:
    registry = ToolRegistry()

    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    def sub(a: int, b: int) -> int:
        """Subtract."""
        return a - b

    assert registry.tool(add) is add
    assert registry.tool(name="minus", replay="idempotent")(sub) is sub
    assert add(1, 2) == 3
    assert registry.names() == ("add", "minus")
    minus = registry.get("minus")
    assert isinstance(minus, Tool)
    assert minus.replay is ReplayPolicy.idempotent
    assert minus.function is sub


def test_registry_lookup_len_contains_and_order() -> None:
    registry = ToolRegistry()

    @registry.tool
    def b_tool() -> str:
        """B."""
        return ""

    @registry.tool
    def a_tool() -> str:
        """A."""
        return ""

    assert len(registry) == 2
    assert "a_tool" in registry
    assert "nope" not in registry
    assert registry.get("nope") is None
    assert registry.names() == ("b_tool", "a_tool")
    assert [s["function"]["name"] for s in registry.specs()] == ["b_tool", "a_tool"]


def test_specs_are_cached_and_rebuilt_when_a_tool_is_added() -> None:
    registry = ToolRegistry()

    @registry.tool
    def one() -> str:
        """One."""
        return ""

    first = registry.specs()
    assert registry.specs() is first

    @registry.tool
    def two() -> str:
        """Two."""
        return ""

    second = registry.specs()
    assert second is not first
    assert [s["function"]["name"] for s in second] == ["one", "two"]
    assert second[0] is first[0]


def test_specs_are_deterministic() -> None:
    def build() -> str:
        registry = ToolRegistry()

        @registry.tool
        def save(person: Person, color: Color = Color.red, n: int | None = None) -> str:
            """Save.

            Args:
                person: who.
            """
            return ""

        return canonical_json(list(registry.specs()))

    assert build() == build()


def test_parameter_names_pydantic_reserves_still_work() -> None:
    registry = ToolRegistry()

    @registry.tool(name="odd-names")
    def odd(json: str, model_config: int, _hidden: int = 0, schema: bool = False) -> str:
        """Parameters whose names shadow pydantic's."""
        return f"{json}:{model_config}:{schema}"

    tool = registry.get("odd-names")
    assert tool is not None
    assert list(_parameters(registry, "odd-names")["properties"]) == [
        "json",
        "model_config",
        "_hidden",
        "schema",
    ]
    assert tool.parse_arguments({"json": "j", "model_config": "4", "_hidden": 2}) == {
        "json": "j",
        "model_config": 4,
        "_hidden": 2,
        "schema": False,
    }


async def test_positional_only_parameters_are_passed_positionally() -> None:
    registry = ToolRegistry()

    @registry.tool
    def pos(a: int, /, b: int) -> str:
        """Positional-only a."""
        return f"{a}-{b}"

    tool = registry.get("pos")
    assert tool is not None
    assert await tool.call({"a": 1, "b": 2}, ToolContext("r", 0, "o")) == "1-2"


def test_callable_object_and_partial_can_be_tools() -> None:
    class Adder:
        """Add a number."""

        def __call__(self, n: int) -> int:
            return n + 1

    def scale(n: int, factor: int) -> int:
        """Scale n."""
        return n * factor

    registry = ToolRegistry()
    registry.register(Adder(), name="adder")
    registry.register(functools.partial(scale, factor=2), name="double")
    assert _parameters(registry, "adder")["required"] == ["n"]
    double = registry.get("double")
    assert double is not None
    assert double.description == "Scale n."
    assert _parameters(registry, "double")["properties"]["factor"] == {
        "type": "integer",
        "default": 2,
    }


async def test_sync_tool_runs_in_a_worker_thread() -> None:
    registry = ToolRegistry()
    thread_ids: list[int] = []

    @registry.tool
    def where() -> str:
        """Record the thread."""
        thread_ids.append(threading.get_ident())
        return ""

    @registry.tool
    async def where_async() -> str:
        """Record the thread."""
        thread_ids.append(threading.get_ident())
        return ""

    env = ToolEnvironment(registry)
    ctx = ToolContext("r", 0, "o")
    await env.execute(Action("where", "where", {}), ctx)
    await env.execute(Action("where_async", "where_async", {}), ctx)
    loop_thread = threading.get_ident()
    assert thread_ids[0] != loop_thread
    assert thread_ids[1] == loop_thread


async def test_a_sync_wrapper_around_a_coroutine_function_is_awaited() -> None:
    registry = ToolRegistry()
    threads: list[int] = []

    async def scaled(x: int) -> str:
        threads.append(threading.get_ident())
        return str(2 * x)

    @registry.tool
    def double(x: int) -> Any:
        """Double x (a sync function returning a coroutine: a decorator's wrapper, say)."""
        return scaled(x)

    tool = registry.get("double")
    assert tool is not None and not tool.is_async
    assert await tool.call({"x": 21}, ToolContext("r", 0, "o")) == "42"
    assert threads == [threading.get_ident()]  # the coroutine ran on the event loop


async def test_sync_tool_does_not_block_the_event_loop() -> None:
    registry = ToolRegistry()
    released = threading.Event()

    @registry.tool
    def wait_for_loop() -> str:
        """Wait until a coroutine on the event loop releases it."""
        return "released" if released.wait(timeout=5) else "blocked"

    async def release_soon() -> None:
        await asyncio.sleep(0)
        released.set()

    tool = registry.get("wait_for_loop")
    assert tool is not None
    result, _ = await asyncio.gather(tool.call({}, ToolContext("r", 0, "o")), release_soon())
    assert result == "released"


# --- registration errors ----------------------------------------------------------------------


def _error(func: Any, **options: Any) -> str:
    registry = ToolRegistry()
    with pytest.raises(ConfigError) as info:
        registry.register(func, **options)
    assert len(registry) == 0, "nothing is registered after an error"
    return str(info.value)


def test_duplicate_name_is_refused() -> None:
    registry = ToolRegistry()

    def f() -> str:
        """F."""
        return ""

    registry.register(f)
    with pytest.raises(ConfigError, match=r"tool 'f' is already registered"):
        registry.register(f)
    registry.register(f, name="f2")
    assert registry.names() == ("f", "f2")


def test_missing_docstring_is_refused() -> None:
    def nodoc(x: int) -> str:
        return ""

    assert "tool 'nodoc' has no docstring" in _error(nodoc)


def test_docstring_without_a_summary_is_refused() -> None:
    def only_args(x: int) -> str:
        """Args:
        x: a number.
        """
        return ""

    assert "tool 'only_args': its docstring starts with a section" in _error(only_args)


@pytest.mark.parametrize("bad_type", [socket.socket, type, threading.Lock])
def test_type_without_json_schema_is_refused_naming_the_parameter(bad_type: Any) -> None:
    def f(ok: int, sock: int) -> str:
        """F."""
        return ""

    f.__annotations__["sock"] = bad_type
    message = _error(f)
    assert "tool 'f', parameter 'sock'" in message
    assert "cannot be expressed as JSON schema" in message


def test_var_args_and_kwargs_are_refused() -> None:
    def star(*items: int) -> str:
        """F."""
        return ""

    def double_star(**options: int) -> str:
        """F."""
        return ""

    assert "tool 'star', parameter *items" in _error(star)
    assert "tool 'double_star', parameter **options" in _error(double_star)


def test_replay_options_are_checked() -> None:
    def f() -> str:
        """F."""
        return ""

    def hook(op_id: str, arguments: Any) -> Outcome | None:
        return None

    assert "replay='reconcile' needs a reconcile=hook" in _error(f, replay="reconcile")
    assert "unknown replay policy 'sometimes'" in _error(f, replay="sometimes")
    assert "only used with replay='reconcile'" in _error(f, reconcile=hook)
    registry = ToolRegistry()
    registry.register(f, replay="reconcile", reconcile=hook)
    tool = registry.get("f")
    assert tool is not None
    assert tool.replay is ReplayPolicy.reconcile
    assert tool.reconcile_hook is hook


@pytest.mark.parametrize("name", ["has space", "x" * 65, "dot.name", "", "<lambda>", "ünï"])
def test_invalid_names_are_refused(name: str) -> None:
    def f() -> str:
        """F."""
        return ""

    assert "a tool name must match" in _error(f, name=name)


def test_lambda_default_name_is_refused() -> None:
    assert "tool '<lambda>'" in _error(lambda: "x")


def test_longest_valid_name_is_accepted() -> None:
    registry = ToolRegistry()

    def f() -> str:
        """F."""
        return ""

    registry.register(f, name="a-Z_9" + "x" * 59)
    assert len(registry.names()[0]) == 64


def test_args_section_naming_a_missing_parameter_is_refused() -> None:
    def f(path: str) -> str:
        """Read.

        Args:
            pth: misspelt.
        """
        return ""

    assert "documents ['pth']" in _error(f)


def test_two_context_parameters_are_refused() -> None:
    def f(a: ToolContext, b: ToolContext) -> str:
        """F."""
        return ""

    assert "tool 'f', parameter 'b': only one ToolContext" in _error(f)


def test_unresolvable_annotation_is_refused() -> None:
    def f(x: NotDefinedAnywhere) -> str:  # type: ignore[name-defined]  # noqa: F821
        """F."""
        return ""

    assert "tool 'f': cannot resolve its annotations" in _error(f)


def test_unannotated_parameter_accepts_any_json_value() -> None:
    registry = ToolRegistry()

    def f(x) -> str:  # type: ignore[no-untyped-def]
        """F."""
        return str(x)

    registry.register(f)
    assert _parameters(registry, "f")["properties"]["x"] == {}
    tool = registry.get("f")
    assert tool is not None
    assert tool.parse_arguments({"x": [1, "a"]}) == {"x": [1, "a"]}
