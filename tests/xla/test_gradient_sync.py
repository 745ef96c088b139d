"""Gradient sync across 4 XLA:CPU ordinals with nbtrain's Accelerator (issue #5): after training,
every ordinal holds the same parameters, equal to a plain-torch CPU reference that averages the
ordinals' per-shard gradients at each step; with gradient clipping, the clipped gradient is the
average's (the same norm on every ordinal), as with DDP; free_memory leaves no per-parameter state
or hook of the strategy behind.

The ordinals are threads of one host process, and their collectives need the test-only
workaround in support.py (torch_xla 2.9.0 only). What the test must respect for it:

- support.ENV is in the host's environment: set here just before the launch (the host adopts
  the launching process's current environment under every start method, the forkserver's too);
- each ordinal seeds and builds its model under the lock (the replicas share torch's RNG); the
  seeds differ, so equal results also show that prepare() broadcast ordinal 0's parameters;
- every step is cut by the prepared loader's sync (the patched one): the loop runs whole epochs
  and reads values only after it. Breaking out early would leave the last optimizer step's
  all-reduce to the implicit sync inside ``.cpu()``, which bypasses the lock: each thread then
  compiles its own graph, the collective ids differ, and XLA aborts the process ("Expected 4
  threads to join the rendezvous ... Termination timeout").
"""

from __future__ import annotations

import pytest
import support
import torch

from nbtrain import notebook_launcher

pytestmark = pytest.mark.timeout(180)

ORDINALS, EPOCHS, LR = 4, 2, 0.1


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 3, generator=g)
    y = x @ torch.tensor([[1.5], [-2.0], [0.5]]) + 0.3 + 0.1 * torch.randn(32, 1, generator=g)
    return torch.utils.data.TensorDataset(x, y)


def make_model(seed: int) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1)


def train_on_ordinal() -> dict:
    from nbtrain import Accelerator

    lock = support.install()
    accelerator = Accelerator()
    rank = accelerator.process_index
    with lock:  # seeding and drawing must not interleave with another replica's draws
        model = make_model(seed=rank)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    loader = torch.utils.data.DataLoader(dataset(), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    batches = []
    for _ in range(EPOCHS):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            batches.append((x, y))
    return {
        "rank": rank,
        "world": accelerator.num_processes,
        "device": str(accelerator.device),
        "initial": initial,
        "batches": [(x.cpu(), y.cpu()) for x, y in batches],  # device data: no graph runs
        "final": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }


def reference(initial: dict, steps: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> dict:
    """Plain torch on the CPU: at each step, the mean of every ordinal's gradient on its batch."""
    model = torch.nn.Linear(3, 1)
    model.load_state_dict(initial)
    for batches in steps:
        grads = []
        for x, y in batches:
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= LR * torch.stack([g[i] for g in grads]).mean(dim=0)
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_accelerator_gradient_sync_matches_a_gradient_averaging_reference(monkeypatch):
    for name, value in support.ENV.items():
        monkeypatch.setenv(name, value)
    results = notebook_launcher(
        train_on_ordinal,
        num_processes=ORDINALS,
        return_all=True,
        progress="off",
    )
    assert [r["rank"] for r in results] == list(range(ORDINALS))
    assert {r["world"] for r in results} == {ORDINALS}
    assert sorted(r["device"] for r in results) == [f"xla:{i}" for i in range(ORDINALS)]

    # Each ordinal trained on its own shard: together, each epoch, the whole dataset once.
    data = dataset()
    per_epoch = len(data) // ORDINALS // 2
    for r in results:
        assert len(r["batches"]) == EPOCHS * per_epoch
    for epoch in range(EPOCHS):
        window = slice(epoch * per_epoch, (epoch + 1) * per_epoch)
        seen = torch.cat([x for r in results for x, _ in r["batches"][window]])
        assert sorted(map(tuple, seen.tolist())) == sorted(map(tuple, data.tensors[0].tolist()))

    # The ordinals started apart (own seeds), so agreement is the work of prepare() + sync.
    assert not torch.equal(results[0]["initial"]["weight"], results[1]["initial"]["weight"])
    final = results[0]["final"]
    assert not torch.equal(final["weight"], results[0]["initial"]["weight"])
    for r in results[1:]:
        for name, value in final.items():
            assert torch.equal(r["final"][name], value), f"ordinal {r['rank']}: {name} differs"

    steps = [[r["batches"][s] for r in results] for s in range(EPOCHS * per_epoch)]
    expected = reference(results[0]["initial"], steps)
    for name, value in expected.items():
        torch.testing.assert_close(final[name], value, rtol=1e-5, atol=1e-6)

    # Not vacuous: averaging matters (ordinal 0 alone, without the others' gradients, differs).
    alone = reference(results[0]["initial"], [[r_batches[0]] for r_batches in steps])
    assert not torch.allclose(alone["weight"], final["weight"], rtol=1e-3, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# Gradient clipping: the average is clipped, not each ordinal's own gradient

MAX_NORM, CLIP_VALUE = 0.5, 0.2


def train_clipped() -> dict:
    """One epoch with clip_grad_norm_, then one with clip_grad_value_ (fresh models)."""
    from nbtrain import Accelerator

    lock = support.install()
    accelerator = Accelerator()
    rank = accelerator.process_index
    out: dict = {"rank": rank}
    for mode in ("norm", "value"):
        with lock:
            model = make_model(seed=rank)
        out[f"{mode}_initial"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        optimizer = torch.optim.SGD(model.parameters(), lr=LR)
        loader = torch.utils.data.DataLoader(dataset(), batch_size=2)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        batches, norms = [], []
        for x, y in loader:
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            if mode == "norm":
                norms.append(accelerator.clip_grad_norm_(model.parameters(), MAX_NORM))
            else:
                accelerator.clip_grad_value_(model.parameters(), CLIP_VALUE)
            optimizer.step()
            optimizer.zero_grad()
            batches.append((x, y))
        # Read after the epoch: every value is computed by then (no implicit sync: support.py).
        out[f"{mode}_batches"] = [(x.cpu(), y.cpu()) for x, y in batches]
        out[f"{mode}_final"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        out[f"{mode}_norms"] = [n.cpu() for n in norms]
        out[f"{mode}_forgotten"] = forget_the_model(accelerator, model)
    out["probe"] = watch_and_drop_a_parameter(accelerator)
    return out


def forget_the_model(accelerator, model) -> dict:
    """free_memory between two trainings: the strategy keeps no state of the old parameters, and
    takes its accumulate-grad hook off a model the script keeps."""
    strategy = accelerator._strategy
    before = len(strategy._watched)
    accelerator.free_memory()
    hooks = [len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()]
    return {"watched": before, "after": len(strategy._watched), "hooks": hooks}


def watch_and_drop_a_parameter(accelerator) -> tuple[int, int]:
    """The strategy's bookkeeping goes with a collected parameter: a new one that gets its id()
    is not taken for it (and so is watched itself)."""
    import gc

    strategy = accelerator._strategy
    probe = torch.nn.Parameter(torch.zeros(1, device=accelerator.device))
    strategy._watch(probe)
    watched = len(strategy._watched)
    del probe
    gc.collect()
    return watched, len(strategy._watched)


def clipped_reference(initial: dict, steps: list, mode: str) -> tuple[dict, list[float]]:
    """Plain torch: average the ordinals' gradients, clip the average, step."""
    model = torch.nn.Linear(3, 1)
    model.load_state_dict(initial)
    norms = []
    for batches in steps:
        grads = []
        for x, y in batches:
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = torch.stack([g[i] for g in grads]).mean(dim=0)
        if mode == "norm":
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        else:
            torch.nn.utils.clip_grad_value_(model.parameters(), CLIP_VALUE)
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return {k: v.detach() for k, v in model.state_dict().items()}, norms


def test_clipping_acts_on_the_averaged_gradient_like_ddp(monkeypatch):
    for name, value in support.ENV.items():
        monkeypatch.setenv(name, value)
    results = notebook_launcher(
        train_clipped, num_processes=ORDINALS, return_all=True, progress="off"
    )
    assert [r["rank"] for r in results] == list(range(ORDINALS))
    for mode in ("norm", "value"):
        steps = [
            [r[f"{mode}_batches"][s] for r in results]
            for s in range(len(results[0][f"{mode}_batches"]))
        ]
        expected, norms = clipped_reference(results[0][f"{mode}_initial"], steps, mode)
        for r in results:  # every replica stepped with the same clipped gradient
            for name, value in expected.items():
                torch.testing.assert_close(
                    r[f"{mode}_final"][name], value, rtol=1e-5, atol=1e-6, msg=f"{mode} {name}"
                )
        if mode == "norm":
            # The norm returned is the averaged gradient's, identical on every ordinal, and
            # large enough that every step was clipped (the test would not see clipping else).
            for r in results:
                assert [float(n) for n in r["norm_norms"]] == [
                    float(n) for n in results[0]["norm_norms"]
                ]
            torch.testing.assert_close(
                torch.stack(results[0]["norm_norms"]), torch.tensor(norms), rtol=1e-5, atol=1e-6
            )
            assert min(norms) > MAX_NORM
    for r in results:
        for mode in ("norm", "value"):  # weight and bias were watched; nothing is left of them
            assert r[f"{mode}_forgotten"] == {"watched": 2, "after": 0, "hooks": [0, 0]}
        assert r["probe"] == (1, 0)
