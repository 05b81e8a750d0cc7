"""A batch-inference job written against broker.sdk: score documents with a small torch model.

Its checkpoint is the cursor into the input (and the partial results), so a preempted run
resumes at the next unscored document. Environment: DOCS (count), BATCH, STEP_SLEEP_S, OUTPUT.
"""

import os
import time

import torch

from broker import sdk

torch.set_num_threads(1)
DOCS = int(os.environ.get("DOCS", "4000"))
BATCH = int(os.environ.get("BATCH", "100"))
STEP_SLEEP_S = float(os.environ.get("STEP_SLEEP_S", "0"))

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.EmbeddingBag(5000, 64), torch.nn.Linear(64, 1)).eval()

state = sdk.restore() or {"cursor": 0, "scores": []}
if state["cursor"]:
    print(f"resumed at document {state['cursor']}", flush=True)
while state["cursor"] < DOCS:
    start = state["cursor"]
    ids = torch.arange(start, start + BATCH).unsqueeze(1) * 7919 % 5000  # each document's tokens
    with torch.no_grad():
        state["scores"] += model(ids.repeat(1, 32)).squeeze(1).tolist()
    state["cursor"] = start + BATCH
    sdk.progress(state["cursor"], DOCS)
    if sdk.should_save() or state["cursor"] % (10 * BATCH) == 0:
        sdk.save(state, step=state["cursor"])
        print(f"scored {state['cursor']}/{DOCS} documents (checkpoint saved)", flush=True)
        if sdk.should_stop():
            print(f"asked to stop: leaving at document {state['cursor']}", flush=True)
            raise SystemExit(0)
    time.sleep(STEP_SLEEP_S)

torch.save(torch.tensor(state["scores"]), os.environ.get("OUTPUT", os.devnull))
print(f"done: {DOCS} documents scored, mean score {sum(state['scores']) / DOCS:.4f}", flush=True)
