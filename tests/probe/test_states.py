"""The probe's states: expert replies spelled as the warm start spells them, wrong replies valid
and worse than the expert's, the policy's turns labelled against the expert."""

from orsd import envs
from orsd.engines.base import Sampling
from orsd.envs import parse_action
from orsd.envs.prompts import demonstration_answer, prompt_templates
from orsd.probe.states import expert_cost, expert_states, policy_replies, same_command
from orsd.train.config import load_config
from orsd.train.evaluate import eval_tasks, make_eval_env
from orsd.train.rollout import Episodes, build_context, rollout
from orsd.train.records import Trajectory
from orsd.train.warmstart import answer_ids
from scripted import ExpertReplayEngine


def setup(tokenizer, tasks: int = 3, wrong: int = 3, *overrides):
    config = load_config(None, ["model.autocast=", *overrides])
    env = make_eval_env(config, "test")
    shadow = envs.make("webshop", split="test", **{**config.env.options, "max_actions": 100})
    chosen = eval_tasks(env, "test", tasks)
    templates = prompt_templates("webshop", config.env.prompt)
    return config, env, shadow, chosen, templates, *expert_states(env, shadow, tokenizer, chosen, wrong, config, 0,
                                                                  templates)


def test_same_command():
    assert same_command("click[ Buy  now ]", "click[Buy Now]")
    assert same_command("search[Red  Shirt]", "search[red shirt]")
    assert not same_command("search[red shirt]", "click[red shirt]")
    assert not same_command(None, "click[Buy Now]")


def test_expert_and_wrong_replies(smol_tokenizer):
    config, env, shadow, tasks, templates, states, replies = setup(smol_tokenizer)
    assert {s.page for s in states} == {"search", "results", "item"}
    for state in states:
        episode = env.fork()
        trajectory = Trajectory(task=tasks[state.task], observations=[episode.reset(tasks[state.task])], actions=[])
        for s in states:  # replay the expert up to this state
            if s.task == state.task and s.turn < state.turn:
                observation, _, _ = episode.step(s.expert)
                trajectory.actions.append(s.expert)
                trajectory.observations.append(observation)
        assert episode.expert_action() == state.expert and episode.state.page == state.page
        context = build_context(smol_tokenizer, episode, trajectory,
                                config.rollout.max_context_tokens - config.rollout.max_new_tokens,
                                config.env.max_history_turns, templates, config.rubric.placement)
        expert, *wrong = [replies[j] for j in state.replies]
        assert expert.role == "expert" and expert.action == state.expert and expert.matches_expert
        assert expert.record.response_ids == answer_ids(smol_tokenizer, demonstration_answer("webshop", state.expert))
        assert parse_action(smol_tokenizer.decode(expert.record.response_ids, skip_special_tokens=True)) == state.expert
        assert 1 <= len(wrong) <= 3 and len({w.action for w in wrong}) == len(wrong)
        best = expert_cost(shadow, tasks[state.task], trajectory.actions, state.expert)
        for reply in [expert, *wrong]:
            assert (reply.record.context_ids, reply.record.rubric_slot) == context[:2]
        for reply in wrong:
            assert reply.role == "wrong" and not reply.matches_expert
            trial = env.fork()
            trial.reset(tasks[state.task])
            for action in trajectory.actions:
                trial.step(action)
            _, _, info = trial.step(reply.action)
            assert info["valid_action"], reply.action
            assert expert_cost(shadow, tasks[state.task], trajectory.actions, reply.action) > best


def test_policy_turns_are_labelled_against_the_expert(smol_tokenizer):
    # the full history: the scripted engine rebuilds each episode from the actions its prompt shows
    config, env, shadow, tasks, templates, _, _ = setup(smol_tokenizer, 2, 3, "env.max_history_turns=0")
    engine = ExpertReplayEngine(smol_tokenizer, env, lambda task, sample: sample == 0, split="test")
    episodes = Episodes(2, Sampling(max_new_tokens=40), 4096, config.env.max_actions, config.env.max_history_turns,
                        templates, config.rubric.placement)
    groups = rollout(engine, smol_tokenizer, env, tasks, episodes, "probe0")
    replies = policy_replies(groups, shadow)
    assert len(replies) == sum(len(t.records) for g in groups for t in g.trajectories)
    expert_turns = [r for r in replies if r.trajectory == 0]
    others = [r for r in replies if r.trajectory == 1]
    assert expert_turns and all(r.matches_expert for r in expert_turns)
    assert others and not any(r.matches_expert for r in others) and all(r.action is None for r in others)
    assert [r.page for r in expert_turns][:3] == ["search", "results", "item"]
