"""Environment adapters by name. Engines are imported lazily, so listing costs nothing."""

from __future__ import annotations

import inspect

from factor_cli.registry import Registry

from .base import Environment, EnvUnavailable

ENVIRONMENTS: Registry[type[Environment]] = Registry("environment")


def register(name: str):
    """Class decorator: ``@register("twx")`` adds an adapter under its spec name."""

    def deco(cls: type[Environment]) -> type[Environment]:
        if cls.spec.name != name:
            raise ValueError(
                f"adapter {cls.__name__} has spec name {cls.spec.name!r}, not {name!r}"
            )
        ENVIRONMENTS.add(name, cls)
        return cls

    return deco


def availability(name: str, **options: object) -> str | None:
    """None when ``name`` can run here, else one line saying what is missing and how to get it.

    Options the adapter's check accepts (e.g. ALFWorld's ``data_root``) are passed to it.
    """
    check = ENVIRONMENTS.get(name).availability  # declared by Environment (None: available)
    accepted = inspect.signature(check).parameters
    return check(**{k: v for k, v in options.items() if k in accepted})


def make_env(name: str, **options: object) -> Environment:
    """Instantiate an adapter, failing with :class:`EnvUnavailable` if it cannot run here."""
    missing = availability(name, **options)
    if missing:
        raise EnvUnavailable(f"{name}: {missing}")
    return ENVIRONMENTS.get(name)(**options)  # type: ignore[call-arg]
