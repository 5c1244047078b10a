"""The horovod alias in one process: the table, the errors, the switch, the refusal, horovod.common.util,
and the new hpcring.torch names' argument checks (their ranked behaviour is in tests/ranked/horovod_alias)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import ROOT

import hpcring
from hpcring.contracts import horovod_alias as contract
from hpcring.errors import ConfigError
from hpcring.horovod_alias import HorovodFeatureMissing, HorovodFrameworkUnavailable, install, uninstall
from hpcring.horovod_alias import common_util as util
from hpcring.horovod_alias.modules import TABLE, UNAVAILABLE

torch = pytest.importorskip("torch")


@pytest.fixture
def alias() -> Iterator[None]:
    install()
    yield
    uninstall()


@pytest.fixture
def fake_horovod(tmp_path: Path) -> Iterator[Path]:
    """A test-made `horovod` package first on sys.path, where a real installation would be found."""
    (tmp_path / "horovod").mkdir()
    (tmp_path / "horovod" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    importlib.invalidate_caches()
    yield tmp_path / "horovod"
    sys.path.remove(str(tmp_path))
    sys.modules.pop("horovod", None)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_module_of_the_table_imports_and_exports_what_it_lists(alias: None, name: str) -> None:
    module = importlib.import_module(name)
    assert module.__name__ == name
    for exported in module.__all__:
        assert getattr(module, exported) is not None, f"{name}.{exported}"


@pytest.mark.parametrize(
    ("name", "missing"), [(n, m) for n, a in sorted(TABLE.items()) for m in sorted(a.missing)]
)
def test_listed_missing_names_say_what_to_use_instead(alias: None, name: str, missing: str) -> None:
    module = importlib.import_module(name)
    assert not hasattr(module, missing)
    with pytest.raises(HorovodFeatureMissing) as err:
        getattr(module, missing)
    assert str(err.value).startswith(f"Horovod's {name}.{missing} is not provided by hpcring; ")
    assert TABLE[name].missing[missing] in str(err.value)


def test_an_unlisted_missing_name_still_names_the_feature(alias: None) -> None:
    import horovod.torch as hvd

    with pytest.raises(AttributeError) as err:
        hvd.allreduce_asyn  # noqa: B018
    assert type(err.value) is HorovodFeatureMissing
    assert "Horovod's horovod.torch.allreduce_asyn" in str(err.value)
    assert "allreduce_async" in str(err.value)  # the closest names it has


@pytest.mark.parametrize(
    "name", [*sorted(UNAVAILABLE), "horovod.tensorflow.keras", "horovod.spark.lightning.estimator"]
)
def test_unsupported_frameworks_name_the_feature_and_the_alternative(alias: None, name: str) -> None:
    prefix = next(p for p in UNAVAILABLE if name == p or name.startswith(p + "."))
    with pytest.raises(HorovodFrameworkUnavailable) as err:
        importlib.import_module(name)
    assert isinstance(err.value, ImportError)
    assert str(err.value) == f"Horovod's {prefix} is not provided by hpcring; {UNAVAILABLE[prefix]}"


def test_an_unknown_horovod_module_lists_what_the_alias_answers(alias: None) -> None:
    with pytest.raises(ImportError, match=r"horovod\.common\.basics .*horovod\.torch\.mpi_ops"):
        importlib.import_module("horovod.common.basics")


def test_horovod_run_is_hpcring_run_looked_up_when_called(
    alias: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import horovod
    import horovod.runner

    calls: list[tuple[Any, ...]] = []

    def run(fn: Any, args: tuple[Any, ...] = (), kwargs: Any = None, np: int = 1) -> list[Any]:
        calls.append((fn, args, np))
        return [fn(*args) for _ in range(np)]

    if getattr(hpcring, "run", None) is None:  # before hpcring.run exists: the clear error
        with pytest.raises(HorovodFeatureMissing, match=r"horovod\.runner\.run .*hpcring run -np N"):
            horovod.run(abs, args=(-2,), np=2)
    monkeypatch.setattr(hpcring, "run", run, raising=False)
    assert horovod.run(abs, args=(-2,), np=3) == [2, 2, 2]
    assert horovod.runner.run(abs, args=(-1,), np=1) == [1]
    assert calls == [(abs, (-2,), 3), (abs, (-1,), 1)]


def test_uninstall_forgets_the_modules(alias: None) -> None:
    import horovod.torch  # noqa: F401

    uninstall()
    assert not any(n == "horovod" or n.startswith("horovod.") for n in sys.modules)
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("horovod")
    install()


def test_a_real_horovod_is_found_past_the_alias_and_refused(alias: None, fake_horovod: Path) -> None:
    assert contract.real_horovod() == str(fake_horovod / "__init__.py")
    with pytest.raises(ConfigError) as err:
        contract.refuse_if_real_horovod()
    assert "\n" not in str(err.value) and "a real Horovod is installed" in str(err.value)
    with pytest.raises(ImportError, match="HPCRING_HOROVOD is set, but a real Horovod is installed"):
        importlib.import_module("horovod")


def test_no_real_horovod_here() -> None:
    assert contract.real_horovod() is None
    contract.refuse_if_real_horovod()


@pytest.mark.parametrize(
    ("value", "on"), [("1", True), ("yes", True), ("ON", True), ("0", False), ("", False)]
)
def test_the_switch(value: str, on: bool) -> None:
    assert contract.requested({"HPCRING_HOROVOD": value}) is on


def test_rank_environment_puts_the_site_folder_first_once() -> None:
    env = contract.rank_environment(os.pathsep.join(["/a", contract.SITE_DIR, "/b"]))
    assert env == {"HPCRING_HOROVOD": "1", "PYTHONPATH": os.pathsep.join([contract.SITE_DIR, "/a", "/b"])}
    assert contract.rank_environment(None)["PYTHONPATH"] == contract.SITE_DIR
    assert (Path(contract.SITE_DIR) / "sitecustomize.py").is_file()


def _python(code: str, **env: str) -> str:
    full = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


def test_import_hpcring_installs_the_alias_when_asked_and_loads_no_torch() -> None:
    code = "import sys, hpcring.horovod_alias as a; print(a.installed(), 'torch' in sys.modules)"
    assert _python(code, HPCRING_HOROVOD="1") == "True False"
    assert _python(code, HPCRING_HOROVOD="0") == "False False"


def test_site_dir_command() -> None:
    def site_dir(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "hpcring.horovod_alias", *args],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    done = site_dir("--site-dir")
    assert done.returncode == 0 and done.stdout.strip() == contract.SITE_DIR
    done = site_dir()
    assert done.returncode == 2 and "usage: python -m hpcring.horovod_alias --site-dir" in done.stderr


def test_common_util_as_horovod_answers() -> None:
    assert util.split_list([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
    assert [util.num_rank_is_power_2(n) for n in (0, 1, 2, 3, 4, 6, 8)] == [
        False, True, True, False, True, False, True,
    ]  # fmt: skip
    ops = type("Ops", (), {"Average": "avg", "Sum": "sum"})
    pick = util.get_average_backwards_compatibility_fun(ops)
    assert pick(None, None) == "avg" and pick("max", None) == "max"
    with pytest.warns(DeprecationWarning):
        assert pick(None, False) == "sum"
    with pytest.raises(ValueError, match="supersedes average"):
        pick("sum", True)
    with util.env(HPCRING_TEST_UTIL_ENV="x", HPCRING_TEST_UNSET=None):
        assert os.environ["HPCRING_TEST_UTIL_ENV"] == "x"
    assert "HPCRING_TEST_UTIL_ENV" not in os.environ
    assert util.is_version_greater_equal_than("2.13.0+cpu", "2.1")
    assert not util.is_version_greater_equal_than("0.27.9", "0.28")
    assert util.is_iterable([]) and not util.is_iterable(3)
    assert util.get_extension_full_path("/p/horovod/torch/__init__.py", "mpi_lib_v2").startswith(
        "/p/horovod/torch/mpi_lib_v2"
    )
    util.check_extension("horovod.torch", "HOROVOD_WITH_PYTORCH", "/x/__init__.py", "mpi_lib_v2")
    for ext in ("horovod.tensorflow", "horovod.mxnet"):
        with pytest.raises(ImportError, match=f"{ext} has not been built: hpcring answers only"):
            util.check_extension(ext, "HOROVOD_WITH_X", "/x/__init__.py", "mpi_lib")
    assert util.extension_available("torch") and not util.extension_available("tensorflow")
    assert util.mpi_built() and not util.gloo_built()


def test_ray_settings_carry_the_switch() -> None:
    from hpcring.ray.settings import MiniSettings, create_elastic_settings, create_settings, horovod_env

    assert horovod_env(create_settings(horovod=True)) == {"HPCRING_HOROVOD": "1"}
    assert horovod_env(create_settings()) == {}
    assert create_elastic_settings(min_num_proc=2, horovod=True).horovod
    with pytest.raises(ConfigError, match="horovod must be True or False"):
        MiniSettings(horovod="yes")  # type: ignore[arg-type]


def test_ray_settings_refuse_a_real_horovod(fake_horovod: Path) -> None:
    from hpcring.ray.settings import create_settings

    with pytest.raises(ConfigError, match="horovod=True was given, but a real Horovod is installed"):
        create_settings(horovod=True)


def test_partial_optimizer_checks_its_arguments() -> None:
    import hpcring.torch as hvd

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="op currently only supports Average and Sum"):
        hvd.PartialDistributedOptimizer(opt, op=hvd.Max)
    with pytest.raises(ValueError, match=r"All local layers must be of torch\.nn\.Module type"):
        hvd.PartialDistributedOptimizer(opt, local_layers=[model.weight])
    with pytest.raises(ValueError, match="backward_passes_per_step must be >= 1"):
        hvd.PartialDistributedOptimizer(opt, backward_passes_per_step=0)
    with pytest.raises(ValueError, match="gradient_predivide_factor not supported"):
        hvd.PartialDistributedOptimizer(opt, op=hvd.Sum, gradient_predivide_factor=2.0)


def test_process_set_queries_need_init() -> None:
    """Before init() (in a fresh interpreter: other tests may initialise this one), Horovod's ValueError."""
    code = (
        "import hpcring.torch as hvd\n"
        "for call in (lambda: hvd.process_set_included(0), hvd.get_process_set_ids_and_ranks):\n"
        "    try:\n"
        "        call()\n"
        "    except ValueError as e:\n"
        "        print(type(e).__name__, 'hvd.init()' in str(e))\n"
    )
    assert _python(code).splitlines() == ["NotInitializedError True"] * 2


def test_horovod_spark_is_hpcring_spark(alias: None) -> None:
    import horovod.spark

    import hpcring.spark

    assert horovod.spark.run is hpcring.spark.run
    assert horovod.spark.SparkJobFailed is hpcring.spark.SparkJobFailed
    assert set(hpcring.spark.__all__) <= set(dir(horovod.spark))


def test_horovod_spark_store_is_hpcring_store(alias: None) -> None:
    import horovod.spark.common.store as hvd_store

    from hpcring.spark.common import store

    assert hvd_store.Store is store.Store and hvd_store.LocalStore is store.LocalStore


def test_horovod_spark_torch_estimator_is_hpcring_estimator(alias: None) -> None:
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'hpcring[spark]')")
    import horovod.spark.torch as hvd_spark_torch

    import hpcring.spark.torch

    assert hvd_spark_torch.TorchEstimator is hpcring.spark.torch.TorchEstimator
    assert hvd_spark_torch.TorchModel is hpcring.spark.torch.TorchModel
