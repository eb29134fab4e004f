"""The ALFWorld text engine, made fast enough to reset many episodes per training step.

This is TextWorld's `PddlEnv` (fast-downward underneath) behind alfworld's `AlfredDemangler` and
`AlfredInfos` wrappers, exactly as alfworld plays a `game.tw-pddl`, with four savings that keep
its behaviour:

- the PDDL->SAS translation, the parsed grammar and the initial facts of a game are made once per
  process and shared by every episode of that game (upstream re-translates on every reset);
- the command text of each grounded action is derived once per game (it depends only on static
  facts), not on every step;
- TextWorld's two text parsers are memoised and its per-symbol context copy is made shallow
  (`memoise_textworld_parsers`): pure functions of their input, redone thousands of times per
  episode upstream;
- the planner's own (optimised) translation is made only when the planner is first asked.

alfworld/textworld/fast_downward are imported lazily: `import orsd.envs` works without them.
Over 400 lines because the four savings patch one engine and are checked against it together.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

INSTALL_HINT = "pip install 'orsd[alfworld]'  (alfworld==0.4.2 with textworld[pddl])"

# fast-downward's translator rewrites sys.argv, swaps sys.stdout and keeps module-level options,
# and tatsu parsers are not re-entrant: one lock serialises both across threads.
_TRANSLATE_LOCK = threading.RLock()
_RECORDS_LOCK = threading.Lock()
_MAX_RECORDS = 64
_records: "collections.OrderedDict[str, GameRecord]" = collections.OrderedDict()
_logics: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
_translation_lib = None
_memoised = False
# the task sentence of a game's grammar: "rhs": "Your task is to: <goal>."
_TASK_RULE = re.compile(r'"rhs": "Your task is to: (.*?)\."\s*\n')
_WORDS = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def task_sentence(grammar: str) -> str | None:
    """The goal sentence a game's grammar announces ("put a clean mug in coffeemachine")."""
    match = _TASK_RULE.search(grammar)
    return match.group(1) if match else None


def require_alfworld() -> None:
    """Import the engine's packages once, with a clear message when the extra is missing."""
    # `import alfworld` sets ALFWORLD_DATA to ~/.cache/alfworld when unset; undo that so the
    # variable keeps meaning "the user points at the official data"
    user_value = os.environ.get("ALFWORLD_DATA")
    try:
        import fast_downward  # noqa: F401
        import textworld  # noqa: F401
        from alfworld.agents.environment import alfred_tw_env  # noqa: F401
        from textworld.envs.pddl import PddlEnv  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"the ALFWorld environment needs the optional alfworld packages: {INSTALL_HINT} "
            f"(import failed: {error})"
        ) from error
    finally:
        if user_value is None:
            os.environ.pop("ALFWORLD_DATA", None)
    memoise_textworld_parsers()


def memoise_textworld_parsers() -> None:
    """Speed up TextWorld's text generation without changing its output.

    Upstream re-parses the same few dozen strings with tatsu on every step and deep-copies the
    derivation context for every symbol; caching the two parsers (pure, string -> tree) and
    copying contexts shallowly takes random play on a 54-object kitchen from ~12 to ~350 steps/s
    (with the per-game command cache).
    Parsed symbols are mutated by the caller, so each cache hit is a deep copy.
    """
    global _memoised
    with _TRANSLATE_LOCK:
        if _memoised:
            return
        import textworld.envs.pddl.textgen as textgen
        import textworld.logic as tw_logic

        parse_symbols = textgen._parse_and_convert
        parse_query = tw_logic.Rule.parse_conjunctive_query.__func__
        symbols: dict[tuple[str, str], Any] = {}
        queries: dict[str, Any] = {}

        def cached_symbols(text: str, rule_name: str, **kwargs: Any) -> Any:
            key = (text, rule_name)
            if key not in symbols:
                with _TRANSLATE_LOCK:
                    symbols[key] = parse_symbols(text, rule_name=rule_name, **kwargs)
            return copy.deepcopy(symbols[key])

        def cached_query(cls: type, expr: str) -> Any:
            if expr not in queries:
                with _TRANSLATE_LOCK:
                    queries[expr] = parse_query(cls, expr)
            return queries[expr]

        def shallow_context(context: dict[str, Any]) -> dict[str, Any]:
            # upstream deep-copies the variable and mapping dicts on every symbol; their values
            # (entity infos, variables) are only read during a derivation, so new dicts suffice
            return {"state": context["state"], "facts": context["facts"],
                    "variables": dict(context["variables"]), "mapping": dict(context["mapping"]),
                    "entity_infos": context["entity_infos"]}

        textgen._parse_and_convert = cached_symbols
        textgen.copy_context = shallow_context
        tw_logic.Rule.parse_conjunctive_query = classmethod(cached_query)
        _memoised = True


@dataclass
class GameRecord:
    """Everything about one game file that does not change between episodes."""

    gamefile: str
    data: dict[str, Any]
    logic: Any  # textworld.envs.pddl.logic.GameLogic
    start: Any  # a PddlState at the initial state (holds the translated task and SAS text)
    sas: bytes
    # (action name, bindings the command template mentions) -> command text
    commands: dict[tuple[Any, ...], str] = field(default_factory=dict)
    _sas_replan: bytes | None = None

    def sas_replan(self) -> bytes:
        """The planner's (optimised) translation, made on first use: plain play never needs it."""
        if self._sas_replan is None:
            import fast_downward

            with _TRANSLATE_LOCK, _restored_argv():
                _, text = fast_downward.pddl2sas(self.data["pddl_domain"], self.data["pddl_problem"],
                                                 optimize=True)
            self._sas_replan = text.encode()
        return self._sas_replan


@contextlib.contextmanager
def _restored_argv() -> Iterator[None]:
    argv = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = argv  # fast-downward's translator overwrites sys.argv


class _PlainTranslation:
    """Stands in for the `fast_downward` module while TextWorld builds a start state: the
    optimised translation it also asks for is deferred to `GameRecord.sas_replan`."""

    def __init__(self, module: Any) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def pddl2sas(self, domain: str, problem: str, verbose: bool = False, optimize: bool = False) -> Any:
        if optimize:
            return None, ""
        return self._module.pddl2sas(domain, problem, verbose=verbose)


def _translate(data: dict[str, Any], logic: Any) -> Any:
    """TextWorld's PddlState of a game's initial state, translated once (under the lock)."""
    global _translation_lib
    import fast_downward
    from textworld.envs.pddl import logic as pddl_logic

    with _TRANSLATE_LOCK, _restored_argv():
        if _translation_lib is None:
            _translation_lib = fast_downward.load_lib()
        pddl_logic.fast_downward = _PlainTranslation(fast_downward)
        try:
            return pddl_logic.PddlState(_translation_lib, data["pddl_problem"], logic)
        finally:
            pddl_logic.fast_downward = fast_downward


def _shared_logic(domain: str, grammar: str) -> Any:
    """GameLogic for (domain, grammar), shared by every game with that pair (LRU cache).

    Games that differ from another only in the task sentence (all of ours) reuse that game's
    parsed logic with the "task" rule replaced, instead of parsing the whole grammar again.
    """
    from textworld.envs.pddl import logic as pddl_logic
    from textworld.envs.pddl.textgen import ContextSensitiveGrammar

    key = domain + "\x00" + grammar
    task = _TASK_RULE.search(grammar)
    base_key = domain + "\x00" + (grammar[:task.start(1)] + "UNKNOWN GOAL" + grammar[task.end(1):] if task else "")
    with _TRANSLATE_LOCK:
        logic = _logics.get(key)
        if logic is None:
            base = _logics.get(base_key) if task else None
            if base is None:
                logic = pddl_logic.GameLogic(domain=domain, grammar=grammar)
                if task:
                    _logics[base_key] = logic
            else:
                logic = copy.copy(base)  # actions and types are shared, read-only after parsing
                logic.grammar = ContextSensitiveGrammar()
                logic.grammar.update(base.grammar)
                task_rule = json.dumps({"task": [{"rhs": f"Your task is to: {task.group(1)}."}]})
                logic.grammar._rules["task"] = ContextSensitiveGrammar.parse(task_rule)._rules["task"]
            _logics[key] = logic
            while len(_logics) > _MAX_RECORDS:
                _logics.popitem(last=False)
        return logic


def game_record(gamefile: str) -> GameRecord:
    """The shared record of `gamefile`, loading and translating it on first use (LRU cache)."""
    gamefile = os.path.abspath(gamefile)
    with _RECORDS_LOCK:
        record = _records.get(gamefile)
        if record is not None:
            _records.move_to_end(gamefile)
            return record
    with open(gamefile, encoding="utf-8") as handle:
        data = json.load(handle)
    logic = _shared_logic(data["pddl_domain"], data["grammar"])
    try:
        start = _translate(data, logic)
    except KeyError as error:
        # fast-downward turns a problem without a relaxed solution into a dummy task whose
        # atoms TextWorld cannot map back ("val1"): the game is unsolvable as written.
        raise ValueError(f"game {gamefile!r} has no solution (translator: {error})") from error
    record = GameRecord(gamefile, data, logic, start, start.sas.encode())
    with _RECORDS_LOCK:
        _records[gamefile] = record
        while len(_records) > _MAX_RECORDS:
            _records.popitem(last=False)
    return record


def _engine_classes() -> tuple[type, type]:
    """Build the engine classes on first use (their bases live in the optional packages).
    Size: the two engine classes are defined inside it so that textworld and alfworld, their bases, are
    imported only on first use."""
    global _ENGINE_CLASSES
    if _ENGINE_CLASSES is not None:
        return _ENGINE_CLASSES
    require_alfworld()
    from textworld.core import GameState
    from textworld.envs.pddl import PddlEnv
    from textworld.envs.pddl import logic as pddl_logic

    class EpisodeState(pddl_logic.PddlState):
        """A fresh initial state of a translated game, loaded into one engine's planner library.

        Copies the translated task and initial facts of `record.start` the way TextWorld's
        `State.copy` does, instead of translating the PDDL again.
        """

        def __init__(self, downward_lib: Any, record: GameRecord) -> None:
            start = record.start
            self._record = record
            self._replan_loaded = False
            self._logic = start._logic
            self.downward_lib = downward_lib
            self.pddl_problem = start.pddl_problem
            self.task, self.sas, self.sas_replan = start.task, start.sas, None
            self._actions = start._actions
            self.name2type = start.name2type
            self._facts = collections.defaultdict(set, {k: set(v) for k, v in start._facts.items()})
            self._vars_by_name = dict(start._vars_by_name)
            self._vars_by_type = collections.defaultdict(
                set, {k: set(v) for k, v in start._vars_by_type.items()}
            )
            self._var_counts = collections.Counter(start._var_counts)
            downward_lib.load_sas(record.sas)

        def replan(self, infos: Any) -> list[str]:
            if not self._replan_loaded:
                self.downward_lib.load_sas_replan(self._record.sas_replan())
                self._replan_loaded = True
            return super().replan(infos)

    class Engine(PddlEnv):
        """`PddlEnv` over shared `GameRecord`s: same text and dynamics, no re-translation."""

        def load(self, gamefile: str) -> None:  # type: ignore[override]
            self._record = game_record(gamefile)
            self._game_file = gamefile
            self._game_data = self._record.data
            self.walkthrough = self._record.data.get("walkthrough")
            self._logic = self._record.logic
            self._pddl_state = self._record.start  # read only, for the entity names
            self._entity_infos = self._get_entity_infos()

        def reset(self) -> Any:
            self._pddl_state = EpisodeState(self.downward_lib, self._record)
            self.prev_state = None
            self.state = GameState()
            self._last_action = None
            self._moves = 0
            self.state.feedback = self._logic.grammar.derive("#intro#", self._context({}, {}))
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

        def _context(self, variables: dict[str, Any], mapping: dict[Any, Any]) -> dict[str, Any]:
            return {
                "state": self._pddl_state,
                "facts": list(self._pddl_state.facts),
                "variables": variables,
                "mapping": mapping,
                "entity_infos": self._entity_infos,
            }

        def _gather_infos(self) -> None:
            # Same fields as PddlEnv._gather_infos; command texts come from the per-game cache.
            state, infos = self._pddl_state, self._entity_infos
            self.state["command_templates"] = sorted(
                {action.template for action in self._logic.actions.values()}
            )
            self.state["won"] = state.check_goal()
            self.state["lost"] = False
            self.state["_entity_infos"] = dict(infos)
            self.state["_facts"] = list(state.facts)
            if self.request_infos.facts:
                self.state["facts"] = [self._get_human_readable_fact(f) for f in self.state["_facts"]]
            self.state["last_action"] = None
            self.state["_last_action"] = self._last_action
            self.state["_valid_actions"] = list(state.all_applicable_actions())
            names = {key: info.name for key, info in infos.items()}
            commands = self._record.commands
            valid_commands = []
            for action in self.state["_valid_actions"]:
                # The text depends only on the bindings its template names (plus static facts):
                # "go to {r}" is the same from every start location.
                mentioned = set(_WORDS.findall(action.command_template))
                key = (action.name, tuple(sorted((ph.name, var.name) for ph, var in action.mapping.items()
                                                 if ph.name in mentioned)))
                command = commands.get(key)
                if command is None:
                    variables = {ph.name: infos[var.name] for ph, var in action.mapping.items()}
                    context = self._context(variables, action.mapping)
                    action.command_template = self._logic.grammar.derive(
                        action.command_template, context
                    )
                    command = commands[key] = action.format_command(names)
                valid_commands.append(command)
            self.state["_valid_commands"] = valid_commands
            self.state["admissible_commands"] = sorted(set(valid_commands))
            if self.request_infos.moves:
                self.state["moves"] = self._moves
            if self.request_infos.policy_commands:
                self.state["policy_commands"] = state.replan(infos)

    _ENGINE_CLASSES = (Engine, EpisodeState)
    return _ENGINE_CLASSES


_ENGINE_CLASSES: tuple[type, type] | None = None


def new_engine(facts: bool = False) -> Any:
    """A wrapped engine with its own copy of fast-downward's library (one episode at a time)."""
    engine_cls, _ = _engine_classes()
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    request = textworld.EnvInfos(admissible_commands=True, won=True, facts=facts, extras=["gamefile"])
    return AlfredDemangler(AlfredInfos(engine_cls(request)))


def world_facts(game_state: Any) -> frozenset:
    """The facts of a game state minus the `checked` bookkeeping that look/examine add."""
    return frozenset(f for f in game_state["_facts"] if f.name != "checked")


def planner_plan(engine: Any) -> list[str]:
    """fast-downward's plan from the engine's current state, as commands ([] if none found)."""
    inner = engine.unwrapped
    return list(inner._pddl_state.replan(inner._entity_infos))


def close_engine(engine: Any) -> None:
    """Unload the engine's private copy of the planner library."""
    import fast_downward

    fast_downward.close_lib(engine.unwrapped.downward_lib)


def play_planner(gamefile: str, engine: Any | None = None, max_actions: int = 50) -> list[str]:
    """Check a game: plan from its start with the planner expert, play the plan, require a win.

    Returns the winning plan; raises ValueError (with the reason) when the game is already won
    at the start, the planner finds no plan, or its plan does not win within `max_actions`.
    """
    engine = engine or new_engine()
    engine.load(gamefile)
    game_state = engine.reset()
    if game_state["won"]:
        raise ValueError(f"game {gamefile!r} is already won in its initial state")
    plan = planner_plan(engine)
    if not plan:
        raise ValueError(f"the planner found no plan for game {gamefile!r}")
    if len(plan) > max_actions:
        raise ValueError(f"the plan for game {gamefile!r} has {len(plan)} > {max_actions} actions")
    for command in plan:
        if command not in game_state["admissible_commands"]:
            raise ValueError(f"planner command {command!r} is not admissible in {gamefile!r}")
        game_state, _, _ = engine.step(command)
    if not game_state["won"]:
        raise ValueError(f"the planner's plan does not win game {gamefile!r}: {plan}")
    return plan
