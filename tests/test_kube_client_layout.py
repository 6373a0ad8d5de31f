"""What ``vgpu_state.kube`` takes for granted about the installed ``kubernetes`` client.

Only a kubeconfig that needs the client's loader (a credential plugin, an auth
provider, merged files) loads the client: :mod:`vgpu_state.kube.clientimport` imports
single modules of it with the ``__init__`` of its packages deferred, and stands in
for two modules those imports name; :mod:`vgpu_state.kube.credentials` reads the
loaded ``Configuration``. Both rest on the client's internal layout,
which the majors of the client change: each assumption is checked here against the
installed client (the newest in ``make test``, the oldest ``pyproject.toml`` allows
in ``make test-lowest``), and a failure names the installed version and what moved.
The behaviour built on them (which modules a connection loads, the package whole
for other code afterwards) is tested in tests/test_kube_lazy_import.py.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
from pathlib import Path

import pytest

from vgpu_state.kube import clientimport

VERSION = importlib.metadata.version("kubernetes")


def _where() -> str:
    return f"kubernetes {VERSION} (pyproject.toml allows it)"


@pytest.mark.parametrize("package", clientimport._EAGER_PACKAGES)
def test_the_deferred_packages_are_packages(package: str) -> None:
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.loader is not None, f"{_where()}: no module {package}"
    assert spec.submodule_search_locations is not None, (
        f"{_where()}: {package} is no longer a package; clientimport cannot defer its __init__"
    )


# The module and the name in it that clientimport hands to KubeApi.connect.
PARTS = [
    ("kubernetes.client.api_client", "ApiClient"),
    ("kubernetes.client.configuration", "Configuration"),
    ("kubernetes.config.config_exception", "ConfigException"),
    ("kubernetes.config.incluster_config", "load_incluster_config"),
    ("kubernetes.config.kube_config", "load_kube_config"),
]


@pytest.mark.parametrize(("module", "name"), PARTS)
def test_each_part_lives_in_the_module_clientimport_imports(module: str, name: str) -> None:
    try:
        found = importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{_where()}: clientimport imports {module}, which is gone: {e}")
    assert hasattr(found, name), f"{_where()}: {module} no longer defines {name}"


def _top_level_imports(module: str) -> list[ast.stmt]:
    """The import statements at the top level of ``module``'s source (not imported here)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{_where()}: no module {module}"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"), spec.origin)
    return [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]


# (the module imported with stand-ins, the module stood in for, the one name it takes)
STAND_INS = [
    ("kubernetes.client.api_client", "dateutil.parser", "parse"),
    ("kubernetes.client.api_client", "multiprocessing.pool", "ThreadPool"),
    ("kubernetes.config.kube_config", "requests_oauthlib", "OAuth2Session"),
]


@pytest.mark.parametrize(("module", "stood_in", "name"), STAND_INS)
def test_a_stand_in_is_asked_only_for_the_name_it_has(
    module: str, stood_in: str, name: str
) -> None:
    """A stand-in holds one callable; the module must bind exactly that name of it at
    import (``from stood_in import name``), and call it only later."""
    taken: list[str] = []
    for node in _top_level_imports(module):
        if isinstance(node, ast.ImportFrom) and node.module == stood_in:
            taken += [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            assert all(alias.name != stood_in for alias in node.names), (
                f"{_where()}: {module} now imports {stood_in} as a module; "
                f"clientimport's stand-in has only {name}"
            )
    assert taken == [name], (
        f"{_where()}: {module} takes {taken or 'nothing'} from {stood_in}; "
        f"clientimport stands in for {name} only (clientimport._import_with_stand_ins)"
    )
    real = importlib.import_module(stood_in)
    assert callable(getattr(real, name, None)), f"{_where()}: {stood_in}.{name} is not callable"


def test_the_kubeconfig_loader_imports_the_oauth_package_deferred() -> None:
    """clientimport defers ``oauthlib.oauth2``'s ``__init__`` before the kubeconfig loader
    imports it: it must still be a package that loader names."""
    names = [
        alias.name
        for node in _top_level_imports(clientimport._KUBECONFIG_MODULE)
        if isinstance(node, ast.Import)
        for alias in node.names
    ]
    assert "oauthlib.oauth2" in names, (
        f"{_where()}: {clientimport._KUBECONFIG_MODULE} no longer imports oauthlib.oauth2; "
        "drop its deferral from clientimport.kubeconfig_loader"
    )
    spec = importlib.util.find_spec("oauthlib.oauth2")
    assert spec is not None and spec.submodule_search_locations is not None


def test_the_configuration_has_what_credentials_read_of_it() -> None:
    """A kubeconfig the client's loader reads (a credential plugin, an auth provider,
    merged files) fills a ``Configuration``; ``credentials.from_configuration`` reads
    these of it."""
    configuration = importlib.import_module("kubernetes.client.configuration").Configuration()
    for attribute in (
        "host",
        "ssl_ca_cert",
        "verify_ssl",
        "cert_file",
        "key_file",
        "username",
        "password",
        "api_key",
        "refresh_api_key_hook",
    ):
        assert hasattr(configuration, attribute), f"{_where()}: Configuration has no {attribute}"
    value = inspect.signature(configuration.get_api_key_with_prefix).parameters
    assert {"identifier", "alias"} <= set(value), (
        f"{_where()}: Configuration.get_api_key_with_prefix takes {sorted(value)}"
    )
