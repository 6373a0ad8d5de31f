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
refreshed (:func:`kubeconfig_loader`).
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
_OAUTH_SESSION_MODULE = "requests_oauthlib"
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
    config_exception: type[Exception]
    load_incluster_config: Callable[..., None]


def client_parts() -> ClientParts:
    """The ``ApiClient`` and ``Configuration`` classes and the in-cluster loader."""
    return ClientParts(
        api_client=_import("kubernetes.client.api_client").ApiClient,
        configuration=_import("kubernetes.client.configuration").Configuration,
        config_exception=_import("kubernetes.config.config_exception").ConfigException,
        load_incluster_config=_import("kubernetes.config.incluster_config").load_incluster_config,
    )


def kubeconfig_loader() -> Callable[..., None]:
    """The client's ``load_kube_config`` (loads YAML support; OAuth on first use)."""
    with _lock:
        if _KUBECONFIG_MODULE not in sys.modules:
            _import_kubeconfig_module()
        loader: Callable[..., None] = _import(_KUBECONFIG_MODULE).load_kube_config
    return loader


def _oauth2_session(*args: Any, **kwargs: Any) -> Any:
    """``requests_oauthlib.OAuth2Session(...)``, imported at the first call: what the
    kubeconfig loader calls (only) to refresh an expired OIDC token."""
    return importlib.import_module(_OAUTH_SESSION_MODULE).OAuth2Session(*args, **kwargs)


def _import_kubeconfig_module() -> None:
    """Import the kubeconfig loader with its OAuth modules deferred: ``oauthlib.oauth2``
    as the ``kubernetes`` packages are (:func:`_defer_init`), and in place of the
    class ``requests_oauthlib.OAuth2Session`` (which loads ``requests``), which the
    loader binds by name, :func:`_oauth2_session`. ``requests_oauthlib`` itself is not
    imported: while the loader is imported it is a module that has only that name (and
    imports the real module for any other), and afterwards it is absent, so other code
    imports the real one."""
    _import("oauthlib")
    _defer_init("oauthlib.oauth2")
    if _OAUTH_SESSION_MODULE in sys.modules:
        _import(_KUBECONFIG_MODULE)
        return
    stand_in = ModuleType(_OAUTH_SESSION_MODULE)
    stand_in.OAuth2Session = _oauth2_session  # type: ignore[attr-defined]

    def real(attribute: str) -> Any:
        if attribute.startswith("__"):  # the import system's probes (``__path__``)
            raise AttributeError(attribute)
        with _lock:
            if sys.modules.get(_OAUTH_SESSION_MODULE) is stand_in:
                del sys.modules[_OAUTH_SESSION_MODULE]
            return getattr(importlib.import_module(_OAUTH_SESSION_MODULE), attribute)

    stand_in.__getattr__ = real  # type: ignore[method-assign]
    sys.modules[_OAUTH_SESSION_MODULE] = stand_in
    try:
        _import(_KUBECONFIG_MODULE)
    finally:
        if sys.modules.get(_OAUTH_SESSION_MODULE) is stand_in:
            del sys.modules[_OAUTH_SESSION_MODULE]
