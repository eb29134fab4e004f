"""Writes generations.jsonl: realistic policy outputs for RubricBundle.parse, with what a careful
reader takes from each (the expected criteria, or null when the bundle must be discarded).
Kept as a script so the corpus stays readable and reviewable; run it after editing."""
import json
from pathlib import Path

C = [
    "The agent searches with a query that contains the key attributes from the instruction",
    "The agent opens a product page before buying and checks its options",
    "The agent selects the size and color options that match the instruction",
    "The agent checks that the price is below the budget before clicking buy now",
    "The agent goes back to the results when a product does not match",
    "The agent avoids repeating the same search query",
    "The agent finishes within a few steps without aimless clicking",
    "The agent reads the product description for the required material",
    "The agent compares at least two candidate products",
]
A = [
    "The agent goes to the location where the target object is most likely to be found",
    "The agent opens closed receptacles before concluding that an object is absent",
    "The agent takes the target object only after it has been seen in an observation",
    "The agent uses the correct appliance (fridge, microwave or sinkbasin) for the required transformation",
    "The agent puts the object in or on the receptacle named in the task",
    "The agent does not repeat an action that produced 'Nothing happens.'",
    "The agent checks the object's state after changing it",
]

cases = []
def add(name, text, expected, reason=None):
    cases.append({"name": name, "text": text, "expected": expected, "reason": reason})

add("plain_numbered", "\n".join(f"{i+1}. {c}" for i, c in enumerate(C[:6])), C[:6])
add("paren_numbers", "\n".join(f"{i+1}) {c}" for i, c in enumerate(A[:5])), A[:5])
add("dash_bullets", "\n".join(f"- {c}" for c in A[:7]), A[:7])
add("star_and_dot_bullets", "\n".join(("* " if i % 2 else "• ") + c for i, c in enumerate(C[:5])), C[:5])
add("preamble_and_outro",
    "Sure! Here is a process rubric based on the attempts above.\n\n"
    + "\n".join(f"{i+1}. {c}" for i, c in enumerate(A[:6]))
    + "\n\nThese criteria focus on the agent's process rather than the final outcome.", A[:6])
add("code_fence",
    "```\n" + "\n".join(f"{i+1}. {c}" for i, c in enumerate(C[:5])) + "\n```", C[:5])
add("code_fence_with_language",
    "Rubric:\n```markdown\n" + "\n".join(f"{i+1}. {c}" for i, c in enumerate(C[:7])) + "\n```\nDone.", C[:7])
LABELS = ["Exploration", "Thoroughness", "Grounding", "Tool use", "Placement"]
add("markdown_bold_labels",
    "\n".join(f"{i+1}. **{label}**: {c}" for i, (label, c) in enumerate(zip(LABELS, A[:5]))),
    [f"{label}: {c}" for label, c in zip(LABELS, A[:5])])
add("bold_numbers", "\n".join(f"**{i+1}.** {c}" for i, c in enumerate(C[:5])), C[:5])
add("criterion_labels", "\n".join(f"Criterion {i+1}: {c}" for i, c in enumerate(A[:6])), A[:6])
add("more_than_eight", "\n".join(f"{i+1}. {c}" for i, c in enumerate(C + ["The agent stops after buying"])),
    C[:8], "truncated")
add("duplicates_removed",
    "\n".join(f"{i+1}. {c}" for i, c in enumerate([C[0], C[1], C[1], C[2], C[0].upper(), C[3], C[4]])),
    C[:5])
add("duplicates_leave_too_few",
    "\n".join(f"{i+1}. {c}" for i, c in enumerate([C[0], C[1], C[1] + ".", C[2], C[0], C[3]])),
    None, "too_few_criteria")
add("only_four", "\n".join(f"{i+1}. {c}" for i, c in enumerate(A[:4])), None, "too_few_criteria")
add("no_list_at_all",
    "A good agent searches carefully, checks the options, compares prices and buys the right item "
    "without wasting steps. A poor agent clicks around at random.", None, "no_criteria")
add("empty", "", None, "no_criteria")
add("placeholders_echoed", "1. <criterion>\n2. <criterion>\n3. ...\n4. ...\n5. ...", None, "no_criteria")
add("headings_with_subitems",
    "1. Exploration:\n   - " + A[0] + "\n   - " + A[1] + "\n2. Manipulation:\n   - " + A[2] + "\n   - " + A[3]
    + "\n   - " + A[4] + "\n3. Efficiency:\n   - " + A[5],
    A[:6])
add("wrapped_continuation_lines",
    "1. The agent searches with a query that contains the key\n   attributes from the instruction\n"
    + "\n".join(f"{i+2}. {c}" for i, c in enumerate(C[1:6])), C[:6])
add("think_block_dropped",
    "<think>\nDraft:\n1. The agent is fast enough overall\n2. The agent is careful overall\n</think>\n"
    + "\n".join(f"{i+1}. {c}" for i, c in enumerate(A[:5])), A[:5])
add("unclosed_think_only", "<think>\n1. " + A[0] + "\n2. " + A[1], None, "no_criteria")
add("mixed_prose_between_items",
    "Here is what matters:\n1. " + C[0] + "\nThis is important because queries drive results.\n2. "
    + C[1] + "\n3. " + C[2] + "\nAlso:\n4. " + C[3] + "\n5. " + C[4], C[:5])
add("short_items_invalid",
    "1. Search.\n2. Click.\n" + "\n".join(f"{i+3}. {c}" for i, c in enumerate(C[:4])), None, "too_few_criteria")
add("numbering_restarts",
    "1. " + A[0] + "\n2. " + A[1] + "\n3. " + A[2] + "\n1. " + A[3] + "\n2. " + A[4] + "\n3. " + A[5],
    A[:6])
add("indented_numbered", "\n".join(f"  {i+1}. {c}" for i, c in enumerate(C[:5])), C[:5])
add("trailing_whitespace_and_crlf", "\r\n".join(f"{i+1}. {c}   " for i, c in enumerate(A[:5])), A[:5])
add("colon_numbers", "\n".join(f"{i+1}: {c}" for i, c in enumerate(C[:5])), C[:5])
add("inline_code_stripped",
    "\n".join(f"{i+1}. {c}" for i, c in enumerate(C[:4])) + "\n5. The agent uses `click[Buy Now]` only once",
    C[:4] + ["The agent uses click[Buy Now] only once"])

with open(Path(__file__).with_name("generations.jsonl"), "w", encoding="utf-8") as out:
    for case in cases:
        out.write(json.dumps(case, ensure_ascii=False) + "\n")
print(len(cases), "cases")
