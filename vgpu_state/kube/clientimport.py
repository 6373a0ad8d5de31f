"""Load only the parts of the official ``kubernetes`` client the adapters use.

``import kubernetes`` runs the package's ``__init__``, which imports every part of
the client: the dynamic client (with ``kubernetes_validate``, ``jsonschema`` and
its schema registry), the websocket streams, the informer, leader election and
the YAML object creator. The adapters use only the ``ApiClient``, its
``Configuration`` and the two credential loaders. :func:`client_parts` imports
those modules directly, with the ``__init__`` of ``kubernetes``,
``kubernetes.config`` and ``kubernetes.utils`` deferred: each of these packages
stays as it is until code asks it for anything that is not one of its loaded
submodules, and then runs its ``__init__`` in full, so other code in the process
sees the usual package. The kubeconfig loader (YAML) loads only when a
kubeconfig is used, never for the in-cluster service account; its OAuth support
(``requests_oauthlib``, ``oauthlib``, ``requests``: a fifth of a command's
start-up), used only to refresh an expired OIDC token, loads when a token is
refreshed, the ``ApiClient``'s date parser (``dateutil.parser``, for the
generated model classes the adapters do not use) when it parses a date, and its
thread pool (``multiprocessing.pool``, for ``async_req`` requests the adapters do
not make) when one is asked for (:func:`_import_with_stand_ins`).

All of this rests on the client's module layout (which modules hold these parts,
which packages they are in, what each module takes from a stood-in one):
``tests/test_kube_client_layout.py`` checks it against the installed client, at the
newest and at the lowest version ``pyproject.toml`` allows.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

_EAGER_PACKAGES = ("kubernetes", "kubernetes.config", "kubernetes.utils")
_KUBECONFIG_MODULE = "kubernetes.config.kube_config"
_PACKAGE_DUNDERS = frozenset({"__version__", "__project__", "__all__"})
_lock = threading.RLock()


def _defer_init(name: str) -> None:
    """Put package ``name`` in ``sys.modules`` with its ``__init__`` not yet run
    (nothing happens when it is imported already)."""
    if name in sys.modules:
        return
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    loader = spec.loader

    def complete(attribute: str) -> Any:
        """Any other attribute: run the package's ``__init__`` now, then answer. Probes
        for special names the package does not define (``__wrapped__``) do not count."""
        if attribute.startswith("__") and attribute not in _PACKAGE_DUNDERS:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        with _lock:
            namespace = package.__dict__
            if namespace.get("__getattr__") is complete:
                del namespace["__getattr__"]
                try:
                    loader.exec_module(package)
                except BaseException:
                    namespace["__getattr__"] = complete
                    raise
        try:
            return namespace[attribute]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}") from None

    package.__getattr__ = complete  # type: ignore[method-assign]
    sys.modules[name] = package
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, package)


def _import(name: str) -> ModuleType:
    with _lock:
        for package in _EAGER_PACKAGES:
            _defer_init(package)
        return importlib.import_module(name)


@dataclass(frozen=True)
class ClientParts:
    """What :meth:`KubeApi.connect <vgpu_state.kube.api.KubeApi.connect>` needs of the client."""

    api_client: Any
    configuration: Any
    load_incluster_config: Callable[..., None]


def client_parts() -> ClientParts:
    """The ``ApiClient`` and ``Configuration`` classes and the in-cluster loader."""
    return ClientParts(
        api_client=_import_with_stand_ins(
            "kubernetes.client.api_client",
            # The date parser serves the generated models; the thread pool, requests
            # made with ``async_req``: neither is used here.
            {"dateutil.parser": "parse", "multiprocessing.pool": "ThreadPool"},
        ).ApiClient,
        configuration=_import("kubernetes.client.configuration").Configuration,
        load_incluster_config=_import("kubernetes.config.incluster_config").load_incluster_config,
    )


def kubeconfig_loader() -> Callable[..., None]:
    """The client's ``load_kube_config`` (loads YAML support; OAuth on first use)."""
    with _lock:
        if _KUBECONFIG_MODULE not in sys.modules:
            _import("oauthlib")
            _defer_init("oauthlib.oauth2")
            _import_with_stand_ins(_KUBECONFIG_MODULE, {"requests_oauthlib": "OAuth2Session"})
        loader: Callable[..., None] = _import(_KUBECONFIG_MODULE).load_kube_config
    return loader


def _on_first_call(module: str, name: str) -> Callable[..., Any]:
    """A stand-in for the callable ``module.name`` that imports ``module`` when called."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    return call


def _import_with_stand_ins(name: str, stand_ins: dict[str, str]) -> ModuleType:
    """Import module ``name``, which binds by name a callable of each module in
    ``stand_ins`` (module -> name) that it calls only on paths the adapters do not
    take (or rarely): each of those modules not imported yet is not imported now.
    While ``name`` is imported such a module is a stand-in that has only that name,
    :func:`_on_first_call` (and imports the real module for any other name); afterwards
    it is absent again, so other code imports the real one."""
    with _lock:
        if name in sys.modules:
            return _import(name)
        placed: dict[str, ModuleType] = {}
        for module, attribute in stand_ins.items():
            if module in sys.modules:
                continue
            stand_in = ModuleType(module)
            setattr(stand_in, attribute, _on_first_call(module, attribute))
            stand_in.__getattr__ = _real_module(module, stand_in)  # type: ignore[method-assign]
            placed[module] = stand_in
        sys.modules.update(placed)
        try:
            return _import(name)
        finally:
            for module, stand_in in placed.items():
                if sys.modules.get(module) is stand_in:
                    del sys.modules[module]


def _real_module(module: str, stand_in: ModuleType) -> Callable[[str], Any]:
    """A stand-in's ``__getattr__``: any other name is the real module's (imported then)."""

    def real(attribute: str) -> Any:
        if attribute.startswith("__"):  # the import system's probes (``__path__``)
            raise AttributeError(attribute)
        with _lock:
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]
            return getattr(importlib.import_module(module), attribute)

    return real
