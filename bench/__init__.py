"""PolyLoop's benchmark suite: ``python -m bench`` (see bench/README.md).

Every configuration runs in its own child process (``python -m bench._child SPEC``), which
prints one JSON object on stdout; the parent repeats, aggregates (median, min–max) and writes
``bench/results/latest.json`` and ``latest.md``. The runner installs nothing: peers that are not
importable are skipped with a note.
"""

__all__ = ["SYSTEMS"]

# name -> (module, the imports that must work (comma-separated), what it is)
SYSTEMS: dict[str, tuple[str, str, str]] = {
    "floor": ("bench.floor", "asyncio", "hand-written asyncio loop (the floor)"),
    "floor_sqlite": (
        "bench.floor",
        "sqlite3",
        "hand-written loop + PolyLoop's fsync'd SQLite commits per step",
    ),
    "polyloop": ("bench.sys_polyloop", "polyloop", "PolyLoop, in-memory journal"),
    "polyloop_sqlite": ("bench.sys_polyloop", "polyloop", "PolyLoop, SQLiteJournal"),
    "polyloop_sqlite_process": (
        "bench.sys_polyloop",
        "polyloop",
        'PolyLoop, SQLiteJournal(writer="process")',
    ),
    "polyloop_postgres": (
        "bench.sys_polyloop",
        "psycopg,psycopg_pool",
        "PolyLoop, PostgresJournal (a server: --pg-dsn, or one started here)",
    ),
    "smolagents": ("bench.peer_smolagents", "smolagents", "smolagents ToolCallingAgent"),
    "mini_swe_agent": ("bench.peer_miniswe", "minisweagent", "mini-swe-agent DefaultAgent"),
    "langgraph": ("bench.peer_langgraph", "langgraph", "LangGraph create_react_agent"),
    "langgraph_sqlite": (
        "bench.peer_langgraph",
        "langgraph.checkpoint.sqlite",
        "LangGraph create_react_agent + AsyncSqliteSaver",
    ),
    "pydantic_ai": ("bench.peer_pydantic_ai", "pydantic_ai", "pydantic-ai Agent"),
    "openai_agents": ("bench.peer_openai_agents", "agents", "openai-agents Runner"),
}
