"""The plugin manager: a typed facade over pluggy.

Plugins are modules holding ``@hookimpl`` functions. They come from setuptools entry points in
the ``trinity`` group (one per distribution), from ``*.py`` files in ``--plugin-dir`` folders,
or are registered directly (tests, embedding applications). Each hook receives a ``register``
callback owned by the host, which checks types, rejects duplicate names and records which
plugin provided every component.

Loading is lazy and happens once per process: the first :func:`get_component` (or
:func:`list_components`, :func:`plugin_infos`) loads everything. Ray workers load again in
their own process; ``--plugin-dir`` folders reach them through ``TRINITY_PLUGIN_DIRS``.

Environment:
    TRINITY_LOAD_PLUGINS     comma-separated distributions to load (``""`` loads none)
    TRINITY_DISABLE_PLUGINS  comma-separated distributions never to load
    TRINITY_PLUGIN_DIRS      extra plugin folders (``os.pathsep``-separated)
    TRINITY_TRACE_HOOKS      set to 1 to log every hook call to stderr
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, overload

import pluggy

from trinity import hookspecs
from trinity.install_hints import install_hint as install_hint  # re-exported: trinity.plugins.install_hint
from trinity.install_hints import install_hint_for
from trinity.plugin_files import describe_exception, dir_module_name, import_file, trace_after, trace_before

if TYPE_CHECKING:
    from click import Command

    from trinity.algorithm.advantage import AdvantageFn
    from trinity.algorithm.algorithm_type import AlgorithmType
    from trinity.algorithm.entropy import EntropyLossFn
    from trinity.algorithm.kl import KLFn
    from trinity.algorithm.policy_loss import PolicyLossFn
    from trinity.algorithm.sample_strategy import SampleStrategy
    from trinity.buffer.selector import Selector
    from trinity.data.operator import Operator
    from trinity.workflow import RewardFn, Workflow

ENTRY_POINT_GROUP = "trinity"
ENV_LOAD = "TRINITY_LOAD_PLUGINS"
ENV_DISABLE = "TRINITY_DISABLE_PLUGINS"
ENV_DIRS = "TRINITY_PLUGIN_DIRS"
ENV_TRACE = "TRINITY_TRACE_HOOKS"

#: Modules of trinity-core that implement hooks for the core's own components (the built-in
#: selectors, operators and commands), by plugin name. They are registered before any plugin and whatever the allow /
#: deny lists say, so those names always resolve; ``trinity plugins`` does not list them.
CORE_PLUGINS: dict[str, str] = {
    "trinity-core": "trinity.buffer.selector",
    "trinity-core/operators": "trinity.data.builtin",
    "trinity-core/commands": "trinity.cli",
}


@dataclass(frozen=True)
class Kind:
    """A kind of component: the hook that registers it, the base class it must subclass (or,
    with ``instances``, be an instance of), and the first-party distributions with components
    of that kind (read from :mod:`trinity.hookspecs`)."""

    name: str
    hook: str
    base: str  # "module:Class", imported on first type check to keep this module light
    providers: tuple[tuple[str, str], ...] = ()
    instances: bool = False

    def accepts(self, component: Any) -> bool:
        """Whether ``component`` may be registered as this kind."""
        base = self.base_class()
        if self.instances:
            return isinstance(component, base)
        return isinstance(component, type) and issubclass(component, base)

    def requirement(self) -> str:
        """What :meth:`accepts` asks for, for messages: ``a subclass of pkg.mod.Base``."""
        base = self.base_class()
        relation = "an instance" if self.instances else "a subclass"
        return f"{relation} of {base.__module__}.{base.__qualname__}"

    @property
    def install_hint(self) -> str:
        """How to install the providers (``""`` when there are none), see :func:`install_hint`."""
        return install_hint_for(self.providers)

    def base_class(self) -> type:
        module, _, attr = self.base.partition(":")
        return getattr(importlib.import_module(module), attr)

    @property
    def plural(self) -> str:
        return self.name[:-1] + "ies" if self.name.endswith("y") else self.name + "s"


def _kinds_from_hookspecs() -> dict[str, Kind]:
    kinds: dict[str, Kind] = {}
    for hook, func in vars(hookspecs).items():
        spec = getattr(func, hookspecs.KIND_ATTRIBUTE, None)
        if isinstance(spec, hookspecs.KindSpec) and hook.startswith("register_"):
            kinds[spec.name] = Kind(spec.name, hook, spec.base, spec.providers, spec.instances)
    return kinds


#: Every component kind, in hookspec order: ``{kind name: Kind}``.
KINDS: dict[str, Kind] = _kinds_from_hookspecs()
_KIND_BY_HOOK = {k.hook: k for k in KINDS.values()}

#: The kind names as a type, for :func:`get_component`'s callers (kept equal to ``KINDS`` by a test).
ComponentKind = Literal[
    "workflow",
    "reward_fn",
    "advantage_fn",
    "policy_loss_fn",
    "kl_fn",
    "entropy_loss_fn",
    "sample_strategy",
    "algorithm_type",
    "selector",
    "operator",
    "command",
]


class PluginError(Exception):
    """Base of plugin errors."""


class ComponentRegistrationError(PluginError):
    """A plugin handed ``register`` something invalid (wrong type, duplicate name)."""


class PluginLoadError(PluginError):
    """One or more plugins failed to load; raised by :func:`check_plugins`."""


class UnknownComponentError(PluginError, LookupError):
    """No component of that kind is registered under that name (or, for a dotted class path,
    the class cannot be imported or is not of that kind: ``reason`` says which)."""

    def __init__(self, kind: str, name: str, installed: list[str], reason: str | None = None) -> None:
        self.kind, self.name, self.installed, self.reason = kind, name, installed, reason
        if reason:
            parts = [f"Cannot use {kind} {name!r}: {reason}."]
        else:
            parts = [f"Unknown {kind} {name!r}."]
            close = difflib.get_close_matches(name, installed, n=1)
            if close:
                parts.append(f"Did you mean {close[0]!r}?")
        known = KINDS.get(kind)
        plural = known.plural if known else kind + "s"
        parts.append(f"Installed {plural}: {', '.join(installed) if installed else '(none)'}.")
        if known and known.install_hint and not reason:
            parts.append(f"More {plural}: {known.install_hint}.")
        super().__init__(" ".join(parts))


@dataclass
class PluginInfo:
    """What ``trinity plugins`` reports about one plugin."""

    name: str
    version: str | None = None
    source: str = "registered"  # "entry-point", "plugin-dir", "registered" or "core"
    hooks: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=dict)
    error: str | None = None
    disabled: str | None = None  # why it was not loaded (allow/deny lists)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "hooks": sorted(self.hooks),
            "components": {k: sorted(v) for k, v in sorted(self.components.items())},
            "error": self.error,
        }


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {_normalise(x) for x in raw.split(",") if x.strip()}


class TrinityPluginManager:
    """Loads plugins and keeps the component registries.

    ``autoload=False`` skips entry points (tests register plugins explicitly with
    :meth:`register_plugin`).
    """

    def __init__(self, *, autoload: bool = True, plugin_dirs: Iterable[str | os.PathLike] = ()) -> None:
        self._pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        if os.environ.get(ENV_TRACE):
            self._pm.add_hookcall_monitoring(trace_before, trace_after)
        self._autoload = autoload
        self._plugin_dirs: list[Path] = []
        self._loaded_dirs: set[Path] = set()
        self._infos: dict[str, PluginInfo] = {}
        self._registry: dict[str, dict[str, tuple[Any, str]]] = {k: {} for k in KINDS}
        self._loaded = False
        self._lock = threading.RLock()
        for d in plugin_dirs:
            self.add_plugin_dir(d)

    # -- loading -------------------------------------------------------------------------

    def load(self) -> None:
        """Load entry-point and plugin-dir plugins (once; later calls load only new dirs)."""
        with self._lock:
            if not self._loaded:
                self._loaded = True
                self._load_core()
                if self._autoload:
                    self._load_entry_points()
            for d in self._plugin_dirs:
                if d not in self._loaded_dirs:
                    self._loaded_dirs.add(d)
                    self._load_dir(d)

    def add_plugin_dir(self, path: str | os.PathLike) -> None:
        """Load every ``*.py`` file of ``path`` as a plugin (files starting with ``_`` skipped)."""
        p = Path(path).expanduser().resolve()
        if not p.is_dir():
            raise PluginError(f"--plugin-dir {path}: not a directory")
        with self._lock:
            if p not in self._plugin_dirs:
                self._plugin_dirs.append(p)
            if self._loaded:
                self.load()

    @property
    def plugin_dirs(self) -> list[Path]:
        return list(self._plugin_dirs)

    def _load_entry_points(self) -> None:
        allow, deny = _env_list(ENV_LOAD), _env_list(ENV_DISABLE) or set()
        eps = sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: (_dist_name(e), e.name))
        per_dist: dict[str, int] = {}
        for ep in eps:
            per_dist[_dist_name(ep)] = per_dist.get(_dist_name(ep), 0) + 1
        for ep in eps:
            dist = _dist_name(ep)
            name = dist if per_dist[dist] == 1 else f"{dist}:{ep.name}"
            version = ep.dist.version if ep.dist else None
            keys = {_normalise(dist), _normalise(ep.name)}
            if allow is not None and not keys & allow:
                self._infos[name] = PluginInfo(name, version, "entry-point", disabled=f"not in {ENV_LOAD}")
                continue
            if keys & deny:
                self._infos[name] = PluginInfo(name, version, "entry-point", disabled=f"in {ENV_DISABLE}")
                continue
            try:
                module = ep.load()
            except Exception as exc:  # a broken plugin must not brick the CLI
                self._infos[name] = PluginInfo(
                    name, version, "entry-point", error=describe_exception(exc, f"importing {ep.value}")
                )
                continue
            self._add(module, name, version, "entry-point")

    def _load_core(self) -> None:
        for name, module_name in CORE_PLUGINS.items():
            info = self._add(importlib.import_module(module_name), name, None, "core")
            if info.error:  # a bug in trinity-core itself: never hide it
                raise PluginError(f"trinity-core's own components failed to register: {info.error}")

    def _load_dir(self, directory: Path) -> None:
        deny = _env_list(ENV_DISABLE) or set()
        for file in sorted(directory.glob("*.py")):
            if file.name.startswith("_"):
                continue
            name = f"{directory.name}/{file.name}"
            if _normalise(file.stem) in deny:
                self._infos[name] = PluginInfo(name, None, "plugin-dir", disabled=f"in {ENV_DISABLE}")
                continue
            mod_name = dir_module_name(file)
            try:
                module = sys.modules.get(mod_name) or import_file(mod_name, file)
            except Exception as exc:
                self._infos[name] = PluginInfo(
                    name, None, "plugin-dir", error=describe_exception(exc, f"importing {file}")
                )
                continue
            self._add(module, name, None, "plugin-dir")

    def register_plugin(self, plugin: Any, name: str, version: str | None = None) -> PluginInfo:
        """Register a plugin object (module, class or instance with ``@hookimpl`` methods).

        Raises :class:`PluginError` when it is invalid; nothing of it stays registered then.
        """
        with self._lock:
            self.load()
            info = self._add(plugin, name, version, "registered")
            if info.error:
                if self._infos.get(name) is info:
                    del self._infos[name]
                raise PluginError(info.error)
            return info

    def unregister_plugin(self, name: str) -> None:
        """Remove a plugin and everything it registered."""
        with self._lock:
            plugin = self._pm.get_plugin(name)
            if plugin is not None:
                self._pm.unregister(plugin, name)
            self._drop_components(name)
            self._infos.pop(name, None)

    def _add(self, plugin: Any, name: str, version: str | None, source: str) -> PluginInfo:
        info = PluginInfo(name, version, source)
        if self._pm.get_plugin(name) is not None:
            info.error = f"a plugin named {name!r} is already registered"
            return info
        self._infos[name] = info
        try:
            self._pm.register(plugin, name=name)
        except (pluggy.PluginValidationError, ValueError) as exc:
            info.error = f"invalid hook implementation: {exc}"
            return info
        callers = self._pm.get_hookcallers(plugin) or []
        unknown = [c.name for c in callers if c.name not in _KIND_BY_HOOK]
        if unknown:
            self._pm.unregister(plugin, name)
            hints = []
            for hook in unknown:
                close = difflib.get_close_matches(hook, list(_KIND_BY_HOOK), n=1)
                hints.append(f"{hook!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            info.error = (
                f"implements unknown hook(s) {', '.join(hints)}; valid hooks: {', '.join(_KIND_BY_HOOK)}"
            )
            return info
        info.hooks = sorted(c.name for c in callers)
        others = [p for p in self._pm.get_plugins() if p is not plugin]
        try:
            for hook in info.hooks:
                kind = _KIND_BY_HOOK[hook]
                caller = self._pm.subset_hook_caller(hook, remove_plugins=others)
                caller(register=self._registrar(kind, name, info))
        except Exception as exc:
            self._pm.unregister(plugin, name)
            self._drop_components(name)
            info.components = {}
            if isinstance(exc, ComponentRegistrationError):
                info.error = str(exc)
            else:
                info.error = describe_exception(exc, "calling its hooks")
        return info

    def _registrar(self, kind: Kind, plugin_name: str, info: PluginInfo):
        def register(name: str, component: type) -> None:
            if not isinstance(name, str) or not name:
                raise ComponentRegistrationError(
                    f"plugin {plugin_name!r}: {kind.hook} registered a {kind.name} with an invalid name {name!r}"
                )
            if not kind.accepts(component):
                raise ComponentRegistrationError(
                    f"plugin {plugin_name!r}: {kind.name} {name!r} must be {kind.requirement()}, "
                    f"got {component!r}"
                )
            existing = self._registry[kind.name].get(name)
            if existing is not None:
                raise ComponentRegistrationError(
                    f"duplicate {kind.name} {name!r}: registered by both plugin {existing[1]!r} "
                    f"and plugin {plugin_name!r}; disable one of them with {ENV_DISABLE}"
                )
            self._registry[kind.name][name] = (component, plugin_name)
            info.components.setdefault(kind.name, []).append(name)

        return register

    def _drop_components(self, plugin_name: str) -> None:
        for registry in self._registry.values():
            for comp_name in [n for n, (_, p) in registry.items() if p == plugin_name]:
                del registry[comp_name]

    # -- queries ---------------------------------------------------------------------------

    @overload
    def get_component(self, kind: Literal["workflow"], name: str) -> type[Workflow]: ...
    @overload
    def get_component(self, kind: Literal["reward_fn"], name: str) -> type[RewardFn]: ...
    @overload
    def get_component(self, kind: Literal["advantage_fn"], name: str) -> type[AdvantageFn]: ...
    @overload
    def get_component(self, kind: Literal["policy_loss_fn"], name: str) -> type[PolicyLossFn]: ...
    @overload
    def get_component(self, kind: Literal["kl_fn"], name: str) -> type[KLFn]: ...
    @overload
    def get_component(self, kind: Literal["entropy_loss_fn"], name: str) -> type[EntropyLossFn]: ...
    @overload
    def get_component(self, kind: Literal["sample_strategy"], name: str) -> type[SampleStrategy]: ...
    @overload
    def get_component(self, kind: Literal["algorithm_type"], name: str) -> type[AlgorithmType]: ...
    @overload
    def get_component(self, kind: Literal["selector"], name: str) -> type[Selector]: ...
    @overload
    def get_component(self, kind: Literal["operator"], name: str) -> type[Operator]: ...
    @overload
    def get_component(self, kind: Literal["command"], name: str) -> Command: ...
    @overload
    def get_component(self, kind: str, name: str) -> type: ...

    def get_component(self, kind: str, name: str) -> Any:
        """The class registered as ``name`` for ``kind`` (see :data:`KINDS`).

        A name that is not registered but has a dot (``pkg.module.Class``, as upstream configs
        name workflows) is imported as a class path, from installed modules or a
        ``--plugin-dir`` folder, and must subclass the kind's base class.
        """
        registry = self._kind_registry(kind)
        entry = registry.get(name)
        if entry is not None:
            return entry[0]
        if "." in name.strip(".") and " " not in name:
            return self._import_class_path(KINDS[kind], name, sorted(registry))
        raise UnknownComponentError(kind, name, sorted(registry))

    def _import_class_path(self, kind: Kind, path: str, installed: list[str]) -> type:
        module_name, _, attr = path.rpartition(".")

        def fail(reason: str) -> UnknownComponentError:
            return UnknownComponentError(kind.name, path, installed, reason)

        try:
            module = self._import_module(module_name)
        except Exception as exc:  # any import failure is the user's to fix: say which and why
            raise fail(
                f"it is not registered, and importing {module_name!r} as a class path failed "
                f"({type(exc).__name__}: {exc})"
            ) from exc
        cls = getattr(module, attr, None)
        if cls is None:
            raise fail(f"it is not registered, and module {module_name!r} has no attribute {attr!r}")
        if not kind.accepts(cls):
            raise fail(f"{cls!r} is not {kind.requirement()}")
        return cls

    def _import_module(self, module_name: str) -> ModuleType:
        """Import ``module_name``; its top-level package may be a file or folder of a
        ``--plugin-dir`` (those win over installed modules, as the user pointed at them)."""
        top, _, rest = module_name.partition(".")
        for directory in self._plugin_dirs:
            file, package = directory / f"{top}.py", directory / top / "__init__.py"
            if file.is_file():
                if rest:
                    raise ImportError(f"{file} is a module, not a package holding {module_name!r}")
                mod_name = dir_module_name(file)
                return sys.modules.get(mod_name) or import_file(mod_name, file)
            if package.is_file():
                loaded = sys.modules.get(top)
                if loaded is None or Path(getattr(loaded, "__file__", "") or "").resolve() != package:
                    import_file(top, package, search=package.parent)
                return importlib.import_module(module_name)
        return importlib.import_module(module_name)

    def component_provider(self, kind: str, name: str) -> str:
        """Name of the plugin that registered ``name`` (for a class path: its module)."""
        cls = self.get_component(kind, name)
        entry = self._registry[kind].get(name)
        return entry[1] if entry is not None else cls.__module__

    def list_components(self, kind: str) -> list[str]:
        """Sorted names registered for ``kind``."""
        return sorted(self._kind_registry(kind))

    def plugin_infos(self, include_disabled: bool = False) -> list[PluginInfo]:
        """Every plugin seen (loaded, broken, and with ``include_disabled`` the blocked ones);
        not the core's own hook modules (:data:`CORE_PLUGINS`)."""
        self.load()
        return [
            i for i in self._infos.values() if (include_disabled or not i.disabled) and i.source != "core"
        ]

    def check_plugins(self) -> None:
        """Raise :class:`PluginLoadError` naming each plugin that failed to load."""
        broken = [i for i in self.plugin_infos() if i.error]
        if broken:
            lines = [f"  - {i.name}: {i.error}" for i in broken]
            raise PluginLoadError(
                "Some Trinity plugins failed to load:\n" + "\n".join(lines) + "\n"
                f"Fix or uninstall them, or skip them with {ENV_DISABLE}="
                + ",".join(i.name.split(":")[0] for i in broken)
            )

    def _kind_registry(self, kind: str) -> dict[str, tuple[Any, str]]:
        if kind not in KINDS:
            raise PluginError(f"unknown component kind {kind!r}; kinds: {', '.join(KINDS)}")
        self.load()
        return self._registry[kind]


def _dist_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else ep.name


# -- the process-wide manager --------------------------------------------------------------

_manager: TrinityPluginManager | None = None
_manager_lock = threading.Lock()


def get_manager() -> TrinityPluginManager:
    """The process-wide manager, created on first use (plugin dirs from ``TRINITY_PLUGIN_DIRS``)."""
    global _manager
    with _manager_lock:
        if _manager is None:
            dirs = [d for d in os.environ.get(ENV_DIRS, "").split(os.pathsep) if d]
            _manager = TrinityPluginManager(plugin_dirs=dirs)
        return _manager


def set_manager(manager: TrinityPluginManager | None) -> TrinityPluginManager | None:
    """Replace the process-wide manager (tests); returns the previous one."""
    global _manager
    with _manager_lock:
        previous, _manager = _manager, manager
        return previous


def add_plugin_dirs(dirs: Iterable[str | os.PathLike]) -> None:
    """Add ``--plugin-dir`` folders here and export them so Ray workers load them too."""
    manager = get_manager()
    for d in dirs:
        manager.add_plugin_dir(d)
    os.environ[ENV_DIRS] = os.pathsep.join(str(p) for p in manager.plugin_dirs)


@overload
def get_component(kind: Literal["workflow"], name: str) -> type[Workflow]: ...
@overload
def get_component(kind: Literal["reward_fn"], name: str) -> type[RewardFn]: ...
@overload
def get_component(kind: Literal["advantage_fn"], name: str) -> type[AdvantageFn]: ...
@overload
def get_component(kind: Literal["policy_loss_fn"], name: str) -> type[PolicyLossFn]: ...
@overload
def get_component(kind: Literal["kl_fn"], name: str) -> type[KLFn]: ...
@overload
def get_component(kind: Literal["entropy_loss_fn"], name: str) -> type[EntropyLossFn]: ...
@overload
def get_component(kind: Literal["sample_strategy"], name: str) -> type[SampleStrategy]: ...
@overload
def get_component(kind: Literal["algorithm_type"], name: str) -> type[AlgorithmType]: ...
@overload
def get_component(kind: Literal["selector"], name: str) -> type[Selector]: ...
@overload
def get_component(kind: Literal["operator"], name: str) -> type[Operator]: ...
@overload
def get_component(kind: Literal["command"], name: str) -> Command: ...
@overload
def get_component(kind: str, name: str) -> type: ...


def get_component(kind: str, name: str) -> Any:
    """The class registered as ``name`` for ``kind``, or the class at a dotted path
    (``pkg.module.Class``) of that kind; raises :class:`UnknownComponentError`."""
    return get_manager().get_component(kind, name)


def list_components(kind: str) -> list[str]:
    """Sorted names registered for ``kind``."""
    return get_manager().list_components(kind)


def plugin_infos(include_disabled: bool = False) -> list[PluginInfo]:
    """What ``trinity plugins`` shows."""
    return get_manager().plugin_infos(include_disabled)


def check_plugins() -> None:
    """Fail fast (``PluginLoadError``) when any plugin is broken; ``trinity run`` calls this."""
    get_manager().check_plugins()
