"""Installing like any package: ``pip install .[xarray]`` into a fresh virtualenv, ``python -m
sharding_store``, the xarray entry point, a bare ``sharding-store``, the names the README
uses, no setuptools deprecation warnings, and a missing extra named in the error."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

import sharding_store

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
#: what a copy of the source tree for ``pip install`` leaves out (venvs, data, caches)
COPY_IGNORE_NAMES = (".git", ".venv*", ".data", ".corpus", "__pycache__", "*.egg-info", "build", ".hypothesis",
                     ".pytest_cache", ".pytest-tmp", "demo-out")
COPY_IGNORE = shutil.ignore_patterns(*COPY_IGNORE_NAMES)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def readme_names(text: str) -> set[str]:
    """Every ``sharding_store`` attribute the README's Python blocks use: ``ss.X`` after
    ``import sharding_store as ss``, ``sharding_store.X``, ``from sharding_store import X``."""
    names: set[str] = set()
    for block in python_blocks(text):
        tree = ast.parse(block)
        aliases = {"sharding_store"}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                aliases |= {a.asname or a.name for a in node.names if a.name == "sharding_store"}
            elif isinstance(node, ast.ImportFrom) and node.module == "sharding_store":
                names |= {a.name for a in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                names.add(node.attr)
    return names


def test_readme_python_blocks_parse_and_every_name_they_use_is_in___all__():
    text = "\n".join(p.read_text() for p in [README, *sorted((ROOT / "docs").glob("*.md"))])
    assert python_blocks(text), "the README shows Python usage"
    names = readme_names(text)
    assert {"open_draft", "migrate"} <= names, names  # the parser finds what is there
    public = set(sharding_store.__all__)
    submodules = {n for n in names if n not in public and importlib.util.find_spec(f"sharding_store.{n}")}
    missing = sorted(names - public - submodules)
    assert not missing, f"README uses names not in sharding_store.__all__: {missing}"
    for n in names - submodules:
        assert getattr(sharding_store, n) is not None


def test_readme_parser_sees_a_name_missing_from___all__():
    """The check above can fail: a README block using a name outside ``__all__``."""
    text = "```python\nimport sharding_store as ss\nss.open_draft('x')\nss.not_public_at_all()\n```\n"
    assert readme_names(text) == {"open_draft", "not_public_at_all"}
    assert "not_public_at_all" not in sharding_store.__all__


def test_python_m_sharding_store_and_a_bare_command_list_the_commands():
    """``python -m sharding_store`` is the CLI; with no command it prints the help (every
    command) on stderr and exits 2, a usage error: nothing was done."""
    env = {**os.environ, "PYTHONPATH": str(Path(sharding_store.__file__).parents[1])}
    ok = subprocess.run([sys.executable, "-m", "sharding_store", "--help"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "migrate" in ok.stdout and "reshard" in ok.stdout, ok.stderr
    bare = subprocess.run([sys.executable, "-m", "sharding_store"], capture_output=True, text=True, env=env)
    assert bare.returncode == 2 and bare.stdout == ""
    for command in ("info", "ls", "migrate", "verify", "reshard"):
        assert re.search(rf"^\s+{command}\s", bare.stderr, flags=re.M), (command, bare.stderr)


def test_missing_xarray_names_the_extra():
    code = (
        "import sys; sys.modules['xarray'] = None\n"  # as if xarray were not installed
        "try:\n"
        "    import sharding_store.xarray_backend\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(sharding_store.__file__).parents[1])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "pip install 'sharding-store[xarray]'" in out, out


def test_setup_cfg_declares_the_extras_and_the_xarray_entry_point():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = cfg["options.extras_require"]
    assert {"s3", "dask", "xarray"} <= set(extras)
    entry = cfg["options.entry_points"]["xarray.backends"].strip()
    assert entry == "sharding_store = sharding_store.xarray_backend:ShardingStoreBackendEntrypoint"
    module, _, cls = entry.split("=", 1)[1].strip().partition(":")
    assert hasattr(importlib.import_module(module), cls)
    # setuptools >= 77 deprecates license classifiers (a warning on every build)
    assert "License ::" not in cfg["metadata"].get("classifiers", "")


ENTRY_POINT_CHECK = r"""
import sys, numpy as np, xarray as xr
import sharding_store as ss
from importlib.metadata import entry_points

path = sys.argv[1]
a = ss.create_draft_array(path, "t2m", shape=(6, 8), chunks=(2, 4), chunks_per_shard=(3, 2), dtype="<f4",
                          fill_value=float("nan"), attrs={"_ARRAY_DIMENSIONS": ["y", "x"], "units": "K"})
a[...] = np.arange(48, dtype="f4").reshape(6, 8)
a[0, 0] = np.nan
(ep,) = [e for e in entry_points(group="xarray.backends") if e.name == "sharding_store"]
assert "sharding_store" in xr.backends.list_engines()
ds = xr.open_dataset(path, engine="sharding_store")
guessed = xr.open_dataset(path)  # no engine: our guess_can_open claims the draft store
want = np.arange(48, dtype="f4").reshape(6, 8); want[0, 0] = np.nan
for d in (ds, guessed):
    np.testing.assert_array_equal(d["t2m"].values, want)
    assert d["t2m"].dims == ("y", "x") and d["t2m"].attrs == {"units": "K"}
print("OK", ep.value, ss.__file__)
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_pip_install_with_the_xarray_extra_into_a_fresh_virtualenv(tmp_path):
    """``pip install '.[xarray]'`` (a real install: dependencies from the package index or
    pip's cache), then ``python -m sharding_store --help`` and ``xr.open_dataset(...,
    engine="sharding_store")`` through the installed entry point; the build prints no
    setuptools deprecation warning."""
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=COPY_IGNORE)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    install = subprocess.run([str(py), "-m", "pip", "install", "-v", f"{src}[xarray]"], capture_output=True,
                             text=True, env=env, cwd=tmp_path, timeout=540)
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    log = install.stdout + install.stderr
    assert "SetuptoolsDeprecationWarning" not in log, re.findall(r".*Deprecat.*", log)[:5]
    helped = subprocess.run([str(py), "-m", "sharding_store", "--help"], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert helped.returncode == 0 and "migrate" in helped.stdout, helped.stderr
    script = subprocess.run([str(env_dir / "bin" / "sharding-store"), "--version"], capture_output=True, text=True,
                            env=env, cwd=tmp_path)
    assert script.returncode == 0 and script.stdout.startswith("sharding-store "), script.stderr
    check = subprocess.run([str(py), "-c", ENTRY_POINT_CHECK, str(tmp_path / "data.zr3")], capture_output=True,
                           text=True, env=env, cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    ok, value, where = check.stdout.split()
    assert ok == "OK" and value.startswith("sharding_store.xarray_backend:")
    assert Path(where).is_relative_to(env_dir), where  # the installed copy, not the source tree


def _build_wheel(tmp_path: Path, name: str, **env_extra: str) -> Path:
    """A wheel of a fresh copy of the source tree (no in-place library, no build dir),
    built by pip as a user's ``pip install .`` would (isolated build environment)."""
    src = tmp_path / name
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns("*.so", "*.dll", "*.pyd", "compat", *COPY_IGNORE_NAMES))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    out = tmp_path / f"{name}-wheel"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(out), str(src)],
                           capture_output=True, text=True, env={**env, **env_extra}, cwd=tmp_path, timeout=540)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


def _wheel_contents(wheel: Path) -> tuple[list[str], str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        return names, z.read(meta).decode()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wheel_without_a_compiler_is_pure(tmp_path):
    """No C compiler (``CC=false``): the optional library is skipped and the wheel is pure,
    ``py3-none-any``, installable on every Python (it was ``cp311-cp311-linux_x86_64``,
    which Python 3.12's pip refuses, with nothing compiled in it)."""
    wheel = _build_wheel(tmp_path, "nocc", CC="false")
    names, meta = _wheel_contents(wheel)
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    assert "Root-Is-Purelib: true" in meta and "Tag: py3-none-any" in meta, meta
    assert not [n for n in names if n.endswith((".so", ".dll", ".pyd"))], names


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_wheel_with_the_library_is_tagged_for_its_platform_only(tmp_path):
    """With a compiler: ``_loops.c`` is a plain shared library (no interpreter tag in its
    name, no ``PyInit_``), the wheel ``py3-none-<platform>``: installable by any Python 3 of
    this platform, 3.12 included, and what it holds is what ``_native`` loads."""
    from packaging import tags

    if shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.skip("no C compiler here")
    wheel = _build_wheel(tmp_path, "cc")
    names, meta = _wheel_contents(wheel)
    py, abi, plat = wheel.name[: -len(".whl")].split("-")[-3:]
    assert (py, abi) == ("py3", "none") and plat != "any", wheel.name
    assert plat in {str(p) for p in tags.platform_tags()}, plat
    assert "Root-Is-Purelib: false" in meta and f"Tag: py3-none-{plat}" in meta, meta
    assert [n for n in names if n.endswith((".so", ".dll", ".pyd"))] == ["sharding_store/codec/_loops.so"], names
    for version in ((3, 11), (3, 12), (3, 13)):
        interp = f"cp{version[0]}{version[1]}"
        supported = {str(t) for t in tags.compatible_tags(python_version=version, interpreter=interp, platforms=[plat])}
        assert f"py3-none-{plat}" in supported, (version, plat)
