"""The model an unedited script trains: the outermost module it calls whose parameters its optimizer holds.

Found at the first forward after the optimizer is built, by a global forward pre-hook and forward hook pair
(they count how deep in module calls the script is, so a block inside the model is never taken for it); both
are removed once it is found, so no module call pays for them afterwards. Where the script builds several
optimizers (a GAN, a teacher and a student), no one module is "the model": the finder says so and takes none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

OnFound = Callable[[torch.nn.Module, tuple[Any, ...]], tuple[Any, ...] | None]


class ModelFinder:
    """Watches module calls, once armed with the optimizer's parameters, until the model is called.

    on_found(model, args): what the model's own forward pre-hook would do on this first call (it is added
    while the call's pre-hooks already run, so torch does not call it now); its result replaces the args."""

    def __init__(self, on_found: OnFound) -> None:
        self.on_found = on_found
        self.model: torch.nn.Module | None = None
        self.params: set[int] = set()
        self.optimizers = 0
        self.depth = 0
        self.handles: list[Any] = []

    def arm(self, optimizer: torch.optim.Optimizer) -> None:
        """An optimizer was built: watch module calls for the model that holds its parameters."""
        self.optimizers += 1
        self.params |= {id(p) for group in optimizer.param_groups for p in group["params"]}
        if self.model is None and not self.handles:
            self.handles = [
                register_module_forward_pre_hook(self._pre),  # type: ignore[arg-type]
                register_module_forward_hook(self._post, always_call=True),
            ]

    def disarm(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _pre(self, module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        self.depth += 1
        if self.depth != 1 or self.model is not None:
            return None
        if not any(id(p) in self.params for p in module.parameters()):
            return None
        self.model = module
        self.disarm()  # this call's forward hook (_post) is already listed: it still runs, once
        return self.on_found(module, args)

    def _post(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        self.depth -= 1
