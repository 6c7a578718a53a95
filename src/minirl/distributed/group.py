"""The controller's side of a distributed run: a trainer group and an engine group that look, to
``minirl.loop``, exactly like the single-process ``Trainer`` and ``RolloutEngine``.

* ``TrainerGroup`` splits every batch it is given into W equal, contiguous shards (routes travel
  with their rows), sends shard r to rank r (``minirl.distributed.rank.TrainerRank``) and joins the
  answers: log-probs, entropies and routes are concatenated back in row order; an update's metrics are
  computed here from the ranks' ``MetricInputs`` joined back (the whole mini-batch's token means and
  maxima, as one process reports them); a metric only the forward knows (the load-balancing loss, a
  row-weighted mean) is the mean of the ranks' own over their equal shares; the loss is summed.
  ``state_dict()`` gathers the full weights from the ranks and also loads them into ``model``, the
  controller's mirror, which checkpoints and evaluation of the run read.
* ``EngineGroup`` splits the prompts of a call into E contiguous chunks, one per engine, and
  concatenates the completions in prompt order (``prompt_index`` renumbered to the whole call).
  Each engine is told where its chunk starts, so per-sample seeding draws what one engine would.
  Engines in this process (``InProcess``) also take a partial rollout's ``DecodeControl``: each decodes its
  chunk in a thread, and at every check their ended rows are joined and the call's stop asked once
  (``_Checks``), so the group stops where one engine would.
* ``GroupReplay`` is the controller's ``RoutingReplay`` (route validation against the model) whose
  ``replayed_rows`` are the ranks' counters summed, so the loop's "every route replayed exactly
  once" check covers the whole group.

Where a worker runs is a *handle*: ``InProcess`` (an object in this process), ``Spawned`` (a
``torch.multiprocessing`` child, for W trainer ranks on one machine) or a Ray actor
(``minirl.distributed.ray_backend``). A worker that raises, dies or is lost surfaces as one
``WorkerError`` naming the worker and the call, and the rest of the group is stopped.
"""

from __future__ import annotations

import itertools
import multiprocessing.connection
import threading
import traceback
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from minirl.batching import split
from minirl.rollout.base import DecodeControl
from minirl.tensors import to_floats
from minirl.trainer import MetricInputs, OnPolicy, ScoreResult, UpdateResult
from minirl.types import Batch, Completion, Prompt, SamplingParams


class WorkerError(RuntimeError):
    """A trainer rank or a rollout engine failed; ``str()`` is one line naming it and the call."""


# ----------------------------------------------------------------------------- handles


class InProcess:
    """A worker object living in this process (calls run when submitted)."""

    def __init__(self, name: str, target: Any) -> None:
        self.name, self.target = name, target

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.target, method)(*args, **kwargs)

    def close(self, graceful: bool = True) -> None:
        if hasattr(self.target, "close"):
            self.target.close()


# what a forkserver imports once, before it forks its first child (torch, transformers and the trainer: ~7 s here)
FORKSERVER_PRELOAD = ("minirl.distributed.rank", "minirl.runtime")


class Spawned:
    """A worker object in a child process, driven over a pipe (one call in flight).

    The child answers its construction first: ``gather([(handle, "__init__")], ...)`` waits for it.
    ``start_method``: ``"spawn"`` starts a fresh interpreter, which imports torch and transformers again (seconds);
    ``"forkserver"`` forks it from a server that imported them once (``FORKSERVER_PRELOAD``), so the processes of each
    group after the first in this process start in milliseconds (the ranks then build their models). The server starts with the first such child and keeps the
    environment and the standard streams it had then. CUDA ranks must not be forked: a process forked from a parent
    that touched the CUDA driver cannot use the GPU, and importing transformers may touch it."""

    def __init__(self, name: str, factory: Any, *args: Any, start_method: str = "spawn") -> None:
        import torch.multiprocessing as mp

        context: Any = mp.get_context(start_method)  # a SpawnContext or a ForkServerContext
        if start_method == "forkserver":
            context.set_forkserver_preload(list(FORKSERVER_PRELOAD))  # read when the server starts, once
        self.name, self.start_method = name, start_method
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, factory, args), daemon=True, name=name)
        self.process.start()
        child.close()

    def submit(self, method: str, *args: Any, **kwargs: Any) -> Any:
        try:
            self.conn.send((method, args, kwargs))
        except (BrokenPipeError, EOFError, OSError):
            self.process.join(timeout=5)
            raise WorkerError(f"{self.name} died (exit code {self.process.exitcode}) before {method}") from None
        return method

    def close(self, graceful: bool = True) -> None:
        """Ask the child to finish (``graceful``), else, or if it does not, terminate it."""
        if graceful and self.process.is_alive():
            try:
                self.conn.send(None)
            except OSError:
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=5)
        self.conn.close()


def _serve(conn: Any, factory: Any, args: tuple) -> None:
    """The child's loop: build the worker (answering the constructor's ``"__init__"`` token), then
    answer ``(method, args, kwargs)`` until ``None`` or until the controller goes away."""
    try:
        target = factory(*args)
        conn.send(("ok", None))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {_one_line(exc)}", traceback.format_exc()))
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:  # the controller went away
            return
        if request is None:
            if hasattr(target, "close"):
                target.close()
            return
        method, call_args, call_kwargs = request
        result: tuple[Any, ...]  # ("ok", value) or ("error", line, traceback): read as status, *payload
        try:
            result = ("ok", getattr(target, method)(*call_args, **call_kwargs))
        except BaseException as exc:  # reported to the controller, which stops the group
            result = ("error", f"{type(exc).__name__}: {_one_line(exc)}", traceback.format_exc())
        conn.send(result)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else repr(exc)


def gather(calls: list[tuple[Any, Any]], what: str) -> list[Any]:
    """Results of submitted calls ``[(handle, token)]`` in order; the first failure -> ``WorkerError``."""
    if not calls:
        return []
    kind = type(calls[0][0])
    if kind is InProcess:
        return [token for _, token in calls]
    if kind is Spawned:
        return _gather_spawned(calls, what)
    from minirl.distributed.ray_backend import gather_ray

    return gather_ray(calls, what)


def _gather_spawned(calls: list[tuple[Spawned, Any]], what: str) -> list[Any]:
    """Wait on every pipe and every process sentinel, so a dead rank is seen at once (its peers
    would otherwise wait for it inside a collective)."""
    results: dict[int, Any] = {}
    pending = dict(enumerate(calls))
    while pending:
        waitables = [h.conn for h, _ in pending.values()] + [h.process.sentinel for h, _ in pending.values()]
        ready = set(multiprocessing.connection.wait(waitables))
        for index, (handle, _) in list(pending.items()):
            if handle.conn in ready:
                try:
                    status, *payload = handle.conn.recv()
                except (EOFError, OSError):  # OSError: ConnectionResetError when the child was killed
                    status, payload = "dead", []
                if status == "error":
                    raise WorkerError(f"{handle.name} failed in {what}: {payload[0]}")
                if status == "dead":
                    handle.process.join(timeout=5)
                    raise WorkerError(f"{handle.name} died (exit code {handle.process.exitcode}) during {what}")
                results[index] = payload[0]
                del pending[index]
            elif handle.process.sentinel in ready:
                handle.process.join(timeout=5)
                raise WorkerError(f"{handle.name} died (exit code {handle.process.exitcode}) during {what}")
    return [results[i] for i in range(len(calls))]


# ----------------------------------------------------------------------------- the trainer group


def _joined(parts: list[ScoreResult]) -> ScoreResult:
    """The ranks' ``ScoreResult`` of their contiguous shards, concatenated back in row order."""

    def cat(field: str) -> torch.Tensor | None:
        values = [getattr(p, field) for p in parts]
        return None if values[0] is None else torch.cat(values)

    logp = cat("logp")
    assert logp is not None  # ScoreResult.logp is always set
    return ScoreResult(logp=logp, entropy=cat("entropy"), routes=cat("routes"), sum_pi_squared=cat("sum_pi_squared"))


class TrainerGroup:
    """W trainer ranks behind the ``Trainer`` interface (``score``, ``update``, ``state_dict``,
    ``checkpoint_state``, ``load_checkpoint_state``, ``consecutive_faults``, ``model``)."""

    def __init__(self, ranks: list[Any], model: torch.nn.Module) -> None:
        self.ranks = ranks
        self.model = model  # the controller's mirror of the weights (checkpoints, resume)
        self.consecutive_faults = 0
        self.updates_done = 0  # the ranks' optimizer steps taken (all alike)
        self._closed = False

    @property
    def world(self) -> int:
        return len(self.ranks)

    def _all(self, method: str, per_rank: list[tuple] | None = None, **kwargs: Any) -> list[Any]:
        args = per_rank or [()] * self.world
        try:
            return gather([(rank, rank.submit(method, *a, **kwargs)) for rank, a in zip(self.ranks, args)], method)
        except WorkerError as err:
            self.close(graceful=False)  # the other ranks may be waiting for the failed one in a collective
            if "timed out" in str(err).lower():  # a rank that waited cluster.collective_timeout_s for its peers
                raise WorkerError(f"{err} (a collective waited longer than cluster.collective_timeout_s)") from None
            raise

    def score(self, batch: Batch, *, replay_routes: bool = False, record_routes: bool = False, entropy: bool = True,
              sum_pi_squared: bool = False) -> ScoreResult:
        shards = split(batch, self.world)
        parts = self._all("score", [(s,) for s in shards], replay_routes=replay_routes, record_routes=record_routes,
                          entropy=entropy, sum_pi_squared=sum_pi_squared)
        return _joined(parts)

    def update(self, minibatch: Batch, objective: Any, *, replay_routes: bool = False, natural_drift: bool = False,
               score: bool = False, record_routes: bool = False, old_pass: bool = False) -> UpdateResult:
        shards = split(minibatch, self.world)
        answers = self._all("update", [(s, objective) for s in shards], replay_routes=replay_routes, natural_drift=natural_drift,
                            score=score, record_routes=record_routes, old_pass=old_pass)
        self.consecutive_faults = answers[0]["consecutive_faults"]
        self.updates_done = answers[0]["updates_done"]
        per_rank: list[UpdateResult] = [a["result"] for a in answers]
        parts = [r.scores for r in per_rank]
        scores = _joined(parts) if all(p is not None for p in parts) else None  # type: ignore[arg-type]
        faults = [r.fault for r in per_rank if r.fault is not None]
        if faults:  # the global gradient norm decides: all skip together
            return UpdateResult(fault=next((f for f in faults if f.startswith("non-finite log-probs")), faults[0]), scores=scores,
                                loss_scale=per_rank[0].loss_scale, overflowed=per_rank[0].overflowed)
        first = per_rank[0]
        inputs = MetricInputs.joined([r.metric_inputs for r in per_rank])  # type: ignore[misc]
        # what the rows' log-probs give, computed over the whole mini-batch; the rest (the forward's own: each rank's
        # objective saw its micro-batches' router logits) the mean of the ranks' row-weighted values over equal shares
        metrics = {key: sum(r.metrics[key] for r in per_rank) / len(per_rank) for key in first.metrics}
        metrics.update(to_floats(inputs.metrics(OnPolicy(objective) if old_pass else objective, minibatch)))
        drift = metrics.pop("routing_natural_diff_frac", None)
        return UpdateResult(loss=sum(r.loss for r in per_rank),  # each rank's share of the mini-batch loss
                            grad_norm=first.grad_norm, lr=first.lr, metrics=metrics,  # norm and lr: global already
                            natural_diff_frac=drift, scores=scores, loss_scale=first.loss_scale)

    def gradient(self, batch: Batch, objective: Any, *, replay_routes: bool = False,
                 with_logp: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``Trainer.gradient`` over the ranks: their local gradient shards one after another (a permutation of the
        single process's flat gradient, the same norms and cosines) and, with ``with_logp``, the log-probs in row
        order."""
        shards = split(batch, self.world)
        parts = self._all("gradient", [(s, objective) for s in shards], replay_routes=replay_routes, with_logp=with_logp)
        faults = [part["fault"] for part in parts if isinstance(part, dict)]
        if faults:
            raise FloatingPointError(faults[0])
        if not with_logp:
            return torch.cat(parts)
        return torch.cat([flat for flat, _ in parts]), torch.cat([logp for _, logp in parts])

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The full weights (gathered from the shards), also loaded into the mirror ``model``; with LoRA adapters
        (on the mirror too) merged, as ``Trainer.state_dict`` gives them."""
        from minirl.models.lora import has_lora, merged_state_dict

        full = self._all("state_dict")[0]
        self.model.load_state_dict(full)
        return {k: v.detach().clone() for k, v in merged_state_dict(self.model).items()} if has_lora(self.model) else full

    def checkpoint_state(self) -> dict[str, Any]:
        return self._all("checkpoint_state")[0]

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """The checkpoint's trainer state, and the mirror's weights (a resume loads them there)."""
        weights = {name: tensor.detach().cpu() for name, tensor in self.model.state_dict().items()}
        self._all("load_checkpoint_state", [(state, weights)] * self.world)
        self.consecutive_faults = int(state.get("consecutive_faults", 0))
        self.updates_done = int(state.get("updates_done", 0))

    def replayed_rows(self) -> list[int]:
        counts = self._all("replayed_rows")
        return [sum(column) for column in zip(*counts)]

    def reference(self) -> GroupReference:
        """The KL penalty's reference, held by the ranks (each its shard of a frozen copy of the starting weights)."""
        return GroupReference(self)

    def critic(self) -> GroupCritic:
        """``algo.adv_baseline: critic``'s value model, held by the ranks (each its FSDP2 shards of it)."""
        return GroupCritic(self)

    def engine_weights(self) -> GroupEngineWeights:
        """``rollout.async_split_mismatch``'s kept weights, held by the ranks (each a copy of its shards)."""
        return GroupEngineWeights(self)

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        for rank in self.ranks:
            try:
                rank.close(graceful)
            except Exception:  # closing after a failure: the worker may be gone already
                pass


class GroupReference:
    """``minirl.reference.Reference`` of a trainer group: each rank scores its shard of the rows with its shard of the
    frozen copy; the TR-DPO sync runs on every rank's shards; the state is the full weights (rank 0's gather)."""

    def __init__(self, group: TrainerGroup) -> None:
        self.group = group

    def logprobs(self, batch: Batch) -> torch.Tensor:
        return torch.cat(self.group._all("reference_logprobs", [(s,) for s in split(batch, self.group.world)]))

    def sync(self, alpha: float) -> None:
        self.group._all("reference_sync", [(alpha,)] * self.group.world)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.group._all("reference_state")[0]

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            self.group._all("load_reference_state", [(state,)] * self.group.world)


class GroupCritic:
    """``minirl.critic.Critic`` of a trainer group: each rank scores and trains on its contiguous shard of the rows with
    its shards of the value model; an update's loss is divided by the whole mini-batch's tokens or responses, so the
    summed shard gradients are one process's, and its loss and token-weighted metrics are the ranks' parts summed."""

    def __init__(self, group: TrainerGroup) -> None:
        self.group = group

    def values(self, batch: Batch) -> torch.Tensor:
        return torch.cat(self.group._all("critic_values", [(s,) for s in split(batch, self.group.world)]))

    def update(self, batch: Batch, values_old: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
        world, size = self.group.world, batch.size // self.group.world
        per_row = batch.mask.sum(dim=1)
        totals = (int(per_row.sum()), int((per_row > 0).sum()))
        rows = [slice(r * size, (r + 1) * size) for r in range(world)]
        parts = self.group._all("critic_update", [(shard, values_old[r], returns[r], totals)
                                                  for shard, r in zip(split(batch, world), rows)])
        summed = {key: sum(part[key] for part in parts) for key in ("vf_loss", "vf_clipfrac", "vpred_mean")}
        same = ("grad_norm", "lr", "overflowed", "loss_scale")  # the global norm, one lr, one skip and scale
        return {**summed, **{key: parts[0][key] for key in same}}

    def state_dict(self) -> dict[str, Any]:
        return self.group._all("critic_state")[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.group._all("load_critic_state", [(state,)] * self.group.world)


class GroupEngineWeights:
    """``minirl.async_rollout.EngineWeights`` of a trainer group: each rank keeps its shards of the weights and scores
    its shard of the rows with them."""

    def __init__(self, group: TrainerGroup) -> None:
        self.group, self.ready = group, False

    def keep(self) -> None:
        self.group._all("engine_weights_keep")
        self.ready = True

    def logprobs(self, batch: Batch, *, replay_routes: bool = False) -> torch.Tensor:
        shards = [(s,) for s in split(batch, self.group.world)]
        return torch.cat(self.group._all("engine_weights_logprobs", shards, replay_routes=replay_routes))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The kept weights in full (rank 0's gather of every rank's kept shards); empty before ``keep()``."""
        return self.group._all("engine_weights_state")[0] if self.ready else {}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if state:
            self.group._all("load_engine_weights_state", [(state,)] * self.group.world)
            self.ready = True


class GroupReplay:
    """The controller's ``RoutingReplay`` for validation, counting the ranks' replayed rows."""

    def __init__(self, local: Any, group: TrainerGroup) -> None:
        self._local, self._group = local, group

    @property
    def replayed_rows(self) -> list[int]:
        return self._group.replayed_rows()

    def __getattr__(self, name: str) -> Any:  # validate, num_layers, layer_names, top_k, ...
        return getattr(self._local, name)


# ----------------------------------------------------------------------------- the engine group


class EngineGroup:
    """E rollout engines behind the ``RolloutEngine`` interface; prompts split in contiguous chunks."""

    def __init__(self, engines: list[Any]) -> None:
        self.engines = engines
        self._closed = False

    def _all(self, method: str, per_engine: list[tuple], **kwargs: Any) -> list[Any]:
        try:
            return gather([(e, e.submit(method, *a, **kwargs)) for e, a in zip(self.engines, per_engine)], method)
        except WorkerError:
            self.close(graceful=False)
            raise

    @property
    def continues_in_call(self) -> bool:
        """Whether ``generate`` takes a ``DecodeControl`` with a stop: engines in this process that each take one."""
        return all(isinstance(e, InProcess) and getattr(e.target, "continues_in_call", False) for e in self.engines)

    def generate(
        self, prompts: list[Prompt], samples_per_prompt: int, sampling: SamplingParams, record_routes: bool = False,
        control: DecodeControl | None = None,
    ) -> list[Completion]:
        bounds = chunk_bounds(len(prompts), len(self.engines))
        busy = [(engine, start, stop) for engine, (start, stop) in zip(self.engines, bounds) if stop > start]
        if control is not None and control.stop is not None:
            assert self.continues_in_call, "a DecodeControl with a stop needs engines in this process"
            n = samples_per_prompt

            def call(engine: Any, a: int, b: int) -> Callable[[Callable[[list[bool]], bool]], Any]:
                def run(local: Callable[[list[bool]], bool]) -> Any:
                    part = replace(control, max_new_tokens=control.max_new_tokens[a * n:b * n], stop=local)
                    return engine.submit("generate", prompts[a:b], n, sampling, record_routes, prompt_offset=a, control=part)
                return run

            parts = _Checks(control.stop, [(b - a) * n for _, a, b in busy]).run([call(e, a, b) for e, a, b in busy])
            return _renumbered(busy, parts)
        n = samples_per_prompt
        budgets = control is not None and self.continues_in_call  # each row's own budget (else the call's longest)
        calls = [(e, e.submit("generate", prompts[a:b], n, sampling, record_routes, prompt_offset=a,
                              **({"control": replace(control, max_new_tokens=control.max_new_tokens[a * n:b * n])}
                                 if budgets and control is not None else {})))
                 for e, a, b in busy]
        try:
            parts = gather(calls, "generate")
        except WorkerError:
            self.close(graceful=False)
            raise
        return _renumbered(busy, parts)
    def load_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        from minirl.distributed.ray_backend import shared

        payload = shared(state_dict, self.engines)  # one copy in Ray's object store for all engines
        self._all("load_weights", [(payload,)] * len(self.engines))

    def get_rng_state(self) -> Any:
        states = self._all("get_rng_state", [()] * len(self.engines))
        return states[0] if len(states) == 1 else {"engines": states}

    def set_rng_state(self, state: Any) -> None:
        states = [state] if len(self.engines) == 1 else state["engines"]
        self._all("set_rng_state", [(s,) for s in states])

    def close(self, graceful: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        for engine in self.engines:
            try:
                engine.close(graceful)
            except Exception:
                pass


def _renumbered(busy: list[tuple[Any, int, int]], parts: list[list[Completion]]) -> list[Completion]:
    """The engines' completions in prompt order, ``prompt_index`` counted over the whole call."""
    completions: list[Completion] = []
    for (_, start, _), part in zip(busy, parts):
        completions += [replace(c, prompt_index=c.prompt_index + start) for c in part]
    return completions


class _Checks:
    """The engines of one controlled call, each in a thread (``EngineGroup.generate``): at check k every engine's
    ended rows (an engine that has returned: all ended) are joined in row order and ``stop`` is asked once; every
    engine gets its answer."""

    def __init__(self, stop: Callable[[list[bool]], bool], rows: list[int]) -> None:
        self.stop, self.rows = stop, rows
        self.condition = threading.Condition()
        self.ended: dict[int, dict[int, list[bool]]] = {}  # check -> engine -> its rows' ended flags
        self.answers: dict[int, bool | BaseException] = {}
        self.finished: set[int] = set()

    def run(self, calls: list[Callable[[Callable[[list[bool]], bool]], Any]]) -> list[Any]:
        """``calls[e](stop_e)``: engine e's generate with its own stop; their results in order."""
        results: list[Any] = [None] * len(calls)
        errors: list[BaseException] = []

        def body(engine: int) -> None:
            try:
                results[engine] = calls[engine](self._local(engine))
            except BaseException as exc:  # re-raised below, in the caller's thread
                errors.append(exc)
            finally:
                with self.condition:
                    self.finished.add(engine)
                    self.condition.notify_all()

        threads = [threading.Thread(target=body, args=(e,), name=f"minirl-engine-{e}", daemon=True) for e in range(len(calls))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results

    def _local(self, engine: int) -> Callable[[list[bool]], bool]:
        checks = itertools.count()

        def stop(ended: list[bool]) -> bool:
            check = next(checks)
            with self.condition:
                self.ended.setdefault(check, {})[engine] = ended
                while check not in self.answers and not self._complete(check):
                    self.condition.wait()
                if check not in self.answers:  # the last engine to report asks, once
                    joined = [flag for e, n in enumerate(self.rows) for flag in self.ended[check].get(e, [True] * n)]
                    try:
                        self.answers[check] = self.stop(joined)
                    except BaseException as exc:  # every engine stops with it
                        self.answers[check] = exc
                    self.condition.notify_all()
                answer = self.answers[check]
            if isinstance(answer, BaseException):
                raise answer
            return answer

        return stop

    def _complete(self, check: int) -> bool:
        return all(e in self.ended[check] or e in self.finished for e in range(len(self.rows)))


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, stop)`` ranges covering ``count`` items, sizes differing by <= 1."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for part in range(parts):
        stop = start + base + (1 if part < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds
