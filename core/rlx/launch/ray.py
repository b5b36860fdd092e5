"""The Ray launcher: each role a group of Ray actors, in a placement group.

The workers are the same classes the local launcher builds; here each runs inside a Ray
actor (``_Hosted``) that first moves to the driver's working directory (so that the
run's local plugins, ``file.py`` or ``module:attr``, import as they do in the driver)
and then builds the worker, which builds its own plugin host: a registry filled in the
driver is not visible in another process. Calls return one future per rank.

Each rollout engine here holds its own copy of the policy. After every update the
policy's rank 0 puts the new weights into Ray's object store once, and every engine
loads them from there (``sync_weights``): the driver never holds them.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any

from rlx.errors import RunError
from rlx.host_memory import keep_freed_memory


def _import_ray():
    try:
        import ray
    except ImportError as e:
        raise RunError("launcher 'ray' needs Ray: pip install 'rlx[ray]' (or pip install 'ray[default]')") from e
    return ray


class _Hosted:
    """The body of every rlx Ray actor: one worker, and a generic way to call it."""

    def __init__(self, cwd: str, threads: int, env: dict, cls: type, args: tuple, kwargs: dict):
        os.chdir(cwd)
        os.environ.update(env)  # a rank of a group: torch.distributed's rendezvous
        keep_freed_memory()
        if threads:
            import torch

            torch.set_num_threads(threads)
        self.worker = cls(*args, **kwargs)

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def call_with(self, method: str, value: Any) -> Any:
        """``method(value)``: Ray resolves ``value`` from an object reference first."""
        return getattr(self.worker, method)(value)


class RayGroup:
    """One role's actors (its data-parallel ranks)."""

    def __init__(self, role: str, actors: list):
        self.role, self.actors = role, actors
        self.size = len(actors)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Future]:
        return [self._named(rank, method, actor.call.remote(method, args, kwargs).future())
                for rank, actor in enumerate(self.actors)]

    def call_each(self, method: str, calls: list[tuple]) -> list[Future]:
        """``method(*calls[i])`` on rank ``i``, for as many ranks as there are calls."""
        return [self._named(rank, method, actor.call.remote(method, args, {}).future())
                for rank, (actor, args) in enumerate(zip(self.actors, calls))]

    def _named(self, rank: int, method: str, remote: Future) -> Future:
        """A future that fails like the worker did, or, when the worker's process is gone,
        with a ``RunError`` naming the role and rank."""
        from ray.exceptions import RayActorError, RayTaskError

        future: Future = Future()

        def done(f: Future) -> None:
            error = f.exception()
            if error is None:
                future.set_result(f.result())
            elif isinstance(error, RayTaskError):  # the worker raised: its own error, as it was
                cause = getattr(error, "cause", None)
                future.set_exception(cause if isinstance(cause, Exception) else error.as_instanceof_cause())
            elif isinstance(error, RayActorError) and getattr(error, "actor_init_failed", False):
                # its constructor raised: the message ends with that error's own last line
                lines = [line for line in str(error).splitlines() if line.strip()]
                future.set_exception(RunError(f"the {self.role} worker (rank {rank}) failed to start: "
                                              f"{lines[-1].strip()}"))
            elif isinstance(error, RayActorError):
                future.set_exception(RunError(f"the {self.role} worker (rank {rank}) died during {method}(): "
                                              f"{str(error).splitlines()[0]}"))
            else:
                future.set_exception(error)

        remote.add_done_callback(done)
        return future

    def wait(self, method: str, *args: Any, **kwargs: Any) -> Any:
        futures = self.call(method, *args, **kwargs)
        results = [f.result() for f in futures]
        return results[0]

    def call_split(self, method: str, batch, *args: Any, **kwargs: Any) -> list[Future]:
        shares = batch.split(len(self.actors))
        return [self._named(rank, method, actor.call.remote(method, (share, *args), kwargs).future())
                for rank, (actor, share) in enumerate(zip(self.actors, shares))]


class RayLauncher:
    """Starts (or joins, with ``address``) a Ray cluster and places one actor per role.

    ``num_cpus`` is Ray's logical CPU count when it starts a local cluster: a label for
    scheduling, not a limit, so every role can hold one logical CPU on a small machine.
    """

    name = "ray"

    def __init__(self, *, address: str = "", num_cpus: int = 8, threads: int = 0, colocate: list[str] = ()):
        ray = _import_ray()
        if not ray.is_initialized():
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        self.ray, self.threads, self.cwd, self.colocate = ray, threads, os.getcwd(), list(colocate)
        self._actor = ray.remote(_Hosted)
        self.group, self.slots = None, {}

    def reserve(self, roles: dict[str, tuple[int, float]]) -> None:
        """One placement group for the run: a device slot per rank, shared by colocated roles
        (``rlx.launch.placement``); it is held until ``shutdown``."""
        from ray.util.placement_group import placement_group

        from rlx.launch.placement import parse_colocate, plan

        gpus = self.ray.cluster_resources().get("GPU", 0) > 0
        bundles, self.slots = plan(roles, parse_colocate(self.colocate, list(roles)), gpus)
        self.group = placement_group(bundles, strategy="PACK")
        try:
            self.ray.get(self.group.ready(), timeout=120)
        except self.ray.exceptions.GetTimeoutError:
            raise RunError(f"the Ray cluster cannot hold the run's {len(bundles)} device slots {bundles} "
                           f"(it has {self.ray.cluster_resources()}): add machines, or colocate roles "
                           f"with launcher.colocate") from None

    def _start(self, role: str, rank: int, env: dict, cls, args: tuple, kwargs: dict):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        slot = self.slots[role][rank]
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=slot.bundle)
        return self._actor.options(num_cpus=slot.cpus, num_gpus=slot.gpus, scheduling_strategy=strategy).remote(
            self.cwd, self.threads, env, cls, args, kwargs)

    def place(self, role: str, cls: type, *args: Any, ranks: int = 1, **kwargs: Any) -> RayGroup:
        """``ranks`` actors of ``cls(*args, **kwargs)`` in the role's slots; several ranks form
        one torch.distributed group (gloo on the CPU, nccl on GPUs), as DeepSpeed's data
        parallelism needs."""
        envs = [{}]
        if ranks > 1:
            address, port = self._rendezvous(role)
            # LOCAL_RANK 0: Ray shows each actor only its own GPUs
            envs = [{"MASTER_ADDR": address, "MASTER_PORT": str(port), "RANK": str(rank), "LOCAL_RANK": "0",
                     "WORLD_SIZE": str(ranks)} for rank in range(ranks)]
        return RayGroup(role, [self._start(role, rank, env, cls, args, kwargs) for rank, env in enumerate(envs)])

    def _rendezvous(self, role: str) -> tuple[str, int]:
        """The address and a free port of the machine that holds the role's rank 0."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        def where() -> tuple[str, int]:
            import ray

            from rlx.engine import _free_port

            return ray.util.get_node_ip_address(), _free_port()

        strategy = PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                    placement_group_bundle_index=self.slots[role][0].bundle)
        return self.ray.get(self.ray.remote(where).options(num_cpus=0, scheduling_strategy=strategy).remote())

    def place_rollout(self, policy: RayGroup, config, tokenizer, engine: str) -> RayGroup:
        """``rollout.num_engines`` independent engines (``native`` or ``vllm``)."""
        from rlx.workers.rollout import RolloutWorker

        build = RolloutWorker.vllm if engine == "vllm" else RolloutWorker.native
        indices = [{"engine_index": i} if engine == "vllm" else {} for i in range(config.rollout.num_engines)]
        return RayGroup("rollout", [self._start("rollout", i, {}, build, (config, tokenizer), kwargs)
                                    for i, kwargs in enumerate(indices)])

    def sync_weights(self, policy: RayGroup, rollout: RayGroup) -> None:
        """Every policy rank takes part in gathering the weights (ZeRO-3); rank 0's copy
        goes into the object store once, and each engine loads it from there."""
        refs = [actor.call.remote("rollout_weights", (), {}) for actor in policy.actors]
        for rank, ref in enumerate(refs):
            policy._named(rank, "rollout_weights", ref.future()).result()
        loads = [rollout._named(rank, "update_weights", actor.call_with.remote("update_weights", refs[0]).future())
                 for rank, actor in enumerate(rollout.actors)]
        for load in loads:
            load.result()

    def shutdown(self) -> None:
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
        self.ray.shutdown()
