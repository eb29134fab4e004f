"""Chat prompts for the policy: a system message, the task, then the full interaction history.

Earlier assistant turns keep only their `<action>...</action>` (Qwen3-style: reasoning of past
turns is dropped); the paper's Table 5 gives the policy the full history. Templates are plain
`str.format` strings in a frozen dataclass; override any of them with
`dataclasses.replace(TEMPLATES["webshop"], system=...)` and pass `templates=` to
`build_messages`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from orsd.envs.actions import format_answer
from orsd.envs.base import Task

ANSWER_FORMAT = (
    "Answer format: think briefly inside <think>...</think>, then give exactly one command "
    "inside <action>...</action>, for example <think>...</think><action>{example}</action>"
)


@dataclass(frozen=True)
class PromptTemplates:
    """The texts of one environment's prompt.

    Fields may use: `{max_actions}` (system); `{task}`, `{observation}`, `{step}`,
    `{max_actions}`, `{admissible}` (first_user, user); `{actions}` (admissible, the commands
    joined by ", "). `invalid_reply` is the assistant text shown for a turn with no valid action.
    """

    system: str
    first_user: str
    user: str
    admissible: str
    invalid_reply: str


_FIRST_USER = "Task: {task}\nStep {step} of {max_actions}. Observation: {observation}{admissible}"
_USER = "Step {step} of {max_actions}. Observation: {observation}{admissible}"
_ADMISSIBLE = "\nAdmissible actions: {actions}"
_INVALID_REPLY = "(invalid reply: no well-formed action tag pair)"

TEMPLATES: dict[str, PromptTemplates] = {
    "webshop": PromptTemplates(
        system=(
            "You are an expert shopping agent in the WebShop online store. You get a shopping "
            "instruction and the current web page as text, its parts separated by [SEP].\n"
            "Commands:\n"
            "- search[<query>]: search the store (only on the search page).\n"
            "- click[<text>]: click a clickable text of the page: a product id such as "
            "B0ABC12345, an option value such as large or black, Description, Features, "
            "Reviews, < Prev, Next >, Back to Search or Buy Now.\n"
            "Find a product matching the instruction (type, attributes, options, price), click "
            "each option the instruction names, then click Buy Now. You have at most "
            "{max_actions} actions.\n" + ANSWER_FORMAT.replace("{example}", "search[red shirt]")
        ),
        first_user=_FIRST_USER,
        user=_USER,
        admissible=_ADMISSIBLE,
        invalid_reply=_INVALID_REPLY,
    ),
    "alfworld": PromptTemplates(
        system=(
            "You are an expert household agent in the ALFWorld text environment. You get a "
            "task and what you observe after each command.\n"
            "Commands: go to <receptacle>, open <receptacle>, close <receptacle>, take <object> "
            "from <receptacle>, move <object> to <receptacle>, examine <something>, use "
            "<object>, heat <object> with <receptacle>, cool <object> with <receptacle>, clean "
            "<object> with <receptacle>, inventory, look. Use names exactly as shown, e.g. "
            "go to fridge 1.\n"
            "Pick one of the admissible actions. You have at most {max_actions} actions.\n"
            + ANSWER_FORMAT.replace("{example}", "go to fridge 1")
        ),
        first_user=_FIRST_USER,
        user=_USER,
        admissible=_ADMISSIBLE,
        invalid_reply=_INVALID_REPLY,
    ),
}

#: the default system prompts, by environment name (with `{max_actions}` unfilled)
SYSTEM_PROMPTS: dict[str, str] = {name: t.system for name, t in TEMPLATES.items()}

#: shorter system prompts for small models on small budgets (the CPU default): about 70 tokens
#: instead of about 200, the command list reduced to its essentials
COMPACT_TEMPLATES: dict[str, PromptTemplates] = {
    "webshop": replace(TEMPLATES["webshop"], system=(
        "You shop in a web store for the item the task describes. Commands: search[query] on the "
        "search page; click[text] on a product id, an option, Back to Search or Buy Now. Click the "
        "options the task names, then Buy Now. At most {max_actions} actions.\n"
        + ANSWER_FORMAT.replace("{example}", "search[red shirt]"))),
    "alfworld": replace(TEMPLATES["alfworld"], system=(
        "You act in a household text game to complete the task. Pick one admissible action per "
        "turn. At most {max_actions} actions.\n" + ANSWER_FORMAT.replace("{example}", "go to fridge 1"))),
}


def prompt_templates(env_name: str, style: str = "full") -> PromptTemplates:
    """The templates of `env_name` in `style` "full" (default) or "compact"."""
    if style not in ("full", "compact"):
        raise ValueError(f"style={style!r}: expected 'full' or 'compact'")
    full = _templates_for(env_name, None)  # also the check of env_name
    return full if style == "full" else COMPACT_TEMPLATES[env_name]


def _templates_for(env_name: str, templates: PromptTemplates | None) -> PromptTemplates:
    if templates is not None:
        if not isinstance(templates, PromptTemplates):
            raise TypeError(f"templates must be a PromptTemplates, got {type(templates).__name__}")
        return templates
    if env_name not in TEMPLATES:
        raise ValueError(
            f"no prompt templates for env name {env_name!r}; expected one of {sorted(TEMPLATES)}"
            " or pass templates="
        )
    return TEMPLATES[env_name]


def _admissible_text(templates: PromptTemplates, admissible: Sequence[str] | None) -> str:
    if admissible is None:
        return ""
    if isinstance(admissible, str) or not all(isinstance(a, str) for a in admissible):
        raise TypeError(f"admissible must be a list of str or None, got {admissible!r}")
    return templates.admissible.format(actions=", ".join(admissible))


def build_messages(
    env: Any,
    task: Task,
    observations: Sequence[str],
    actions: Sequence[str | None],
    admissible: Sequence[str] | None = None,
    templates: PromptTemplates | None = None,
) -> list[dict[str, str]]:
    """The chat messages for the policy's next action.

    `env` gives `name` and `max_actions`; `observations` holds the reset observation and the
    one after each earlier action (one more than `actions`); `actions` are the earlier parsed
    commands (None where the reply had no valid action); `admissible` lists the commands valid
    now (shown in the last user message only).
    """
    name, max_actions = getattr(env, "name", None), getattr(env, "max_actions", None)
    if not isinstance(name, str) or not isinstance(max_actions, int):
        raise TypeError(f"env must have a str `name` and an int `max_actions`, got {env!r}")
    if not isinstance(task, Task):
        raise TypeError(f"task must be an orsd.envs.Task, got {type(task).__name__}")
    if len(observations) != len(actions) + 1:
        raise ValueError(
            f"observations must have one more element than actions, got {len(observations)} "
            f"observations and {len(actions)} actions"
        )
    if not all(isinstance(o, str) for o in observations):
        raise TypeError("observations must all be str")
    if not all(a is None or isinstance(a, str) for a in actions):
        raise TypeError("actions must all be str or None")
    t = _templates_for(name, templates)
    last = len(actions)
    messages = [{"role": "system", "content": t.system.format(max_actions=max_actions)}]
    for turn, observation in enumerate(observations):
        fields = {
            "task": task.description, "observation": observation, "step": turn + 1,
            "max_actions": max_actions,
            "admissible": _admissible_text(t, admissible) if turn == last else "",
        }
        template = t.first_user if turn == 0 else t.user
        messages.append({"role": "user", "content": template.format(**fields)})
        if turn < last:
            action = actions[turn]
            content = t.invalid_reply if action is None else f"<action>{action}</action>"
            messages.append({"role": "assistant", "content": content})
    return messages


def demonstration_answer(env_name: str, action: str, thought: str = "") -> str:
    """The exact assistant text of one warm-start turn:
    `<think>thought</think><action>action</action>`."""
    if env_name not in TEMPLATES:
        raise ValueError(f"env_name must be one of {sorted(TEMPLATES)}, got {env_name!r}")
    return format_answer(action, thought)
