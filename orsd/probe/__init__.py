"""The Δ probe (`orsd-probe`): does Δ = log π(reply | context + rubric) − log π(reply | context)
point the right way on a given policy?

It holds the reply fixed and varies only the privileged context: at decision states of expert
episodes on held-out shop tasks it scores the expert's reply and valid but wrong replies, and the
policy's own rollouts, under the oracle rubric (written from the goal), a misleading one (another
task's oracle), the bundle the run would select (B*) and three controls of B*'s form (content-free,
the rejected bundle, other tasks' criteria); the splice and the replay are training's own
(`orsd.train.replay.paired_replay`). Its question is the paired AUC P(Δ_expert > Δ_wrong) at the
same state, with bootstrap intervals (issues 57 and 60; docs/evidence.md).

- `states`: the expert's states and replies, the wrong replies, the policy's own turns, labelled;
- `kinds`: the rubric of every kind per task (B* by training's write / verify / select stages);
- `scoring`: every reply's per-token log-probs under every context, by paired replay;
- `stats`: paired and unpaired AUCs, bootstrap intervals (scipy), the summary of probe.json;
- `report`: probe.md and probe.html; `cli`: the command.

Beside it, the verifier check (`orsd-verifier-check`, issue 67): can the run's verifier tell
satisfied from unsatisfied criteria? `truth`: episodes whose oracle criteria have a truth known by
rule; `verifier_check`: their cells scored through training's `verify`, AUCs with intervals over
tasks; `verifier_cli`: the command.
"""
