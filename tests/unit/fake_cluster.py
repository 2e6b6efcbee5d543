"""A fake of what the reconciler talks to, for unit tests of the reconciler itself: an object store that
answers server-side apply, merge patches and deletes the way the API server does for the fields these tests
look at (defaults added, quantities canonical, resourceVersion and generation bumped), and kopf-like indexes
computed from the same store. Not a Kubernetes API: the integration tests run the real one."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Iterator, Mapping
from typing import Any

from specdeploy_operator.builders import OperatorSettings
from specdeploy_operator.controller.kube import ApiError, ObjectRef, ref_of
from specdeploy_operator.controller.reconciler import INDEX_IDS, INDEX_OF_KIND, Reconciler, engines_used

Obj = dict[str, Any]
StoreKey = tuple[str, str, str]


def _merge(live: Any, applied: Any) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        out = dict(live)
        for key, value in applied.items():
            out[key] = _merge(live.get(key), value)
        return out
    return copy.deepcopy(applied)


def _merge_patch(live: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(live) if isinstance(live, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


def server_defaults(obj: Obj) -> None:
    """A few of the defaults the API server adds, so comparisons see more than the operator sent."""
    if obj["kind"] == "Service":
        obj["spec"].setdefault("clusterIP", "10.96.0.10")
        obj["spec"].setdefault("sessionAffinity", "None")
    if obj["kind"] == "Deployment":
        pod = obj["spec"]["template"]["spec"]
        pod.setdefault("dnsPolicy", "ClusterFirst")
        pod.setdefault("schedulerName", "default-scheduler")
        for container in pod.get("containers", []):
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("imagePullPolicy", "IfNotPresent")
        obj["spec"]["template"]["metadata"].setdefault("creationTimestamp", None)


class FakeKube:
    """Records every request; `refuse[(kind, name)]` makes applies of that object fail with 403: the value is
    the Status message, or the whole Status body when it is JSON (an object)."""

    def __init__(self) -> None:
        self.store: dict[StoreKey, Obj] = {}
        self.requests: list[tuple[str, str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.refuse: dict[tuple[str, str], str] = {}
        self._versions = itertools.count(1)

    def key(self, obj: Mapping[str, Any]) -> StoreKey:
        meta = obj["metadata"]
        return (str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))

    def _bump(self, obj: Obj, spec_changed: bool) -> None:
        meta = obj["metadata"]
        meta["resourceVersion"] = str(next(self._versions))
        if spec_changed:
            meta["generation"] = int(meta.get("generation") or 0) + 1

    async def apply(self, obj: Mapping[str, Any]) -> Obj:
        kind, _, name = self.key(obj)
        self.requests.append(("apply", kind, name))
        if (kind, name) in self.refuse:
            path = ref_of(obj).path()
            refusal = self.refuse[(kind, name)]
            body = refusal if refusal.startswith("{") else json.dumps({"message": refusal})
            raise ApiError("PATCH", path, 403, body)
        live = self.store.get(self.key(obj))
        merged = _merge(copy.deepcopy(live) if live else {}, dict(obj))
        if live is not None and obj["kind"] == "Service":
            # Server-side apply keeps list items another manager owns (ports are keyed by port and protocol).
            mine = {(p["port"], p.get("protocol", "TCP")) for p in obj["spec"].get("ports", [])}
            theirs = [
                p for p in live["spec"].get("ports", []) if (p["port"], p.get("protocol", "TCP")) not in mine
            ]
            merged["spec"]["ports"] = theirs + copy.deepcopy(obj["spec"].get("ports", []))
            names = [p.get("name") for p in merged["spec"]["ports"]]
            if len(set(names)) != len(names):
                path = ref_of(obj).path()
                raise ApiError("PATCH", path, 422, '{"message": "spec.ports[1].name: Duplicate value"}')
        merged["metadata"].setdefault("uid", f"uid-{name}")
        server_defaults(merged)
        self._bump(merged, live is None or live.get("spec") != merged.get("spec"))
        self.store[self.key(obj)] = merged
        return copy.deepcopy(merged)

    async def patch(self, ref: ObjectRef, patch: Mapping[str, Any], subresource: str | None = None) -> Obj:
        self.requests.append(("patch" + (f"/{subresource}" if subresource else ""), ref.kind, ref.name))
        key = (ref.kind, ref.namespace, ref.name)
        live = self.store[key]
        patched = _merge_patch(live, dict(patch))
        self._bump(patched, subresource is None and live.get("spec") != patched.get("spec"))
        self.store[key] = patched
        return copy.deepcopy(patched)

    async def delete(self, ref: ObjectRef, uid: str | None = None) -> None:
        self.requests.append(("delete", ref.kind, ref.name))
        self.store.pop((ref.kind, ref.namespace, ref.name), None)

    async def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    async def events_about(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        self.requests.append(("list", "Event", name))
        return []

    async def close(self) -> None:
        return None

    def edit(self, kind: str, namespace: str, name: str, change: dict[str, Any]) -> None:
        """Another actor's merge patch (kubectl edit): not a request of the operator's."""
        key = (kind, namespace, name)
        self.store[key] = _merge_patch(self.store[key], change)
        self._bump(self.store[key], True)

    def writes(self) -> list[tuple[str, str, str]]:
        return [r for r in self.requests if r[0] != "get"]


class StoreIndex(Mapping[Any, list[Obj]]):
    """A kopf-like index over the fake store: (namespace, name) -> [object] for one kind."""

    def __init__(self, kube: FakeKube, kind: str) -> None:
        self.kube, self.kind = kube, kind

    def _items(self) -> dict[Any, list[Obj]]:
        return {(k[1], k[2]): [copy.deepcopy(v)] for k, v in self.kube.store.items() if k[0] == self.kind}

    def __getitem__(self, key: Any) -> list[Obj]:
        return self._items()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


class UsersIndex(Mapping[Any, list[str]]):
    """The `engine_users` index: (namespace, EngineBuild) -> deployment names."""

    def __init__(self, kube: FakeKube, settings: OperatorSettings) -> None:
        self.kube, self.settings = kube, settings

    def _items(self) -> dict[Any, list[str]]:
        out: dict[Any, list[str]] = {}
        for (kind, namespace, name), obj in self.kube.store.items():
            if kind == "SpeculativeDeployment":
                for engine in engines_used(obj, self.settings):
                    out.setdefault((namespace, engine), []).append(name)
        return out

    def __getitem__(self, key: Any) -> list[str]:
        return self._items()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._items())

    def __len__(self) -> int:
        return len(self._items())


def bound_reconciler(kube: FakeKube, settings: OperatorSettings | None = None) -> Reconciler:
    """A reconciler over the fake store, its queue not started (tests call the reconcile steps directly)."""
    settings = settings or OperatorSettings()
    reconciler = Reconciler(kube, settings)  # type: ignore[arg-type]
    indices: dict[str, Any] = {
        kind_index: StoreIndex(kube, kind) for kind, kind_index in INDEX_OF_KIND.items()
    }
    indices["engine_users"] = UsersIndex(kube, settings)
    indices["pods"] = {}
    assert set(indices) == set(INDEX_IDS)
    reconciler.indices = indices
    return reconciler
