"""Lightning Fabric integration (``lightning_fabric``, installed with the ``lightning`` extra).

Importing it makes a Fabric loop's objects resume objects as ``fabric`` hands them back:

- a loader ``fabric.setup_dataloaders`` returned around a
  ``ResumableDataLoader(..., resumable=True)`` is accepted from ``_resume_loaders()`` as
  it is (its state is the inner loader's delivered position; see
  :mod:`~trainer_resume.adapters.fabric.loaders`), and one around a loader whose position
  cannot be saved is refused with the loader to wrap named;
- :func:`setup_dataloaders`: ``fabric.setup_dataloaders`` with the data shared by a rule
  that does not depend on the number of processes, so a pause resumes on any number;
- :func:`resume_objects`: the objects ``fabric.setup`` returned, plus the precision
  plugin's ``GradScaler`` when it has one (objects set up by such a Fabric without it are
  refused when training starts);
- :func:`loader_epoch`: the epoch a resumed epoch loop starts at.

The ``_FabricModule`` ``fabric.setup`` returns saves its state and gradients under the
model's own names whether or not this is imported (``_module_names``).

Requires ``pytorch-lightning`` 2.5.3 or later (tested with 2.5.3 to 2.6.6, :data:`RELEASES`). The
adapter reads Fabric internals, every one named in :data:`INTERNALS` and checked when it
is imported: a release without one of them (or with another shape of it) is refused with
``FrameworkReleaseError`` (352) naming it; a newer release than the tested ones warns once
(``UntestedReleaseWarning``) and works. This is the ``lightning_fabric`` package; the
unified ``lightning`` package's ``lightning.fabric`` is not supported.
"""

from __future__ import annotations

from .._release import FABRIC, Attribute, Function, Name, Refers, check_release

RELEASES = FABRIC
_WRAPPERS = "lightning_fabric.wrappers"
_FABRIC = "lightning_fabric.fabric:Fabric"
_LOADER = f"{_WRAPPERS}:_FabricDataLoader"
_MODULE = f"{_WRAPPERS}:_FabricModule"

# Everything of Fabric the adapter's modules (and _module_names) read, call or rely on Fabric doing.
INTERNALS = (
    # loaders.py: the wrapper is read through the loader it iterates, every batch of which it
    # yields (moved to the device), setting its samplers' epochs from its iteration count.
    Name(_LOADER),
    Attribute(f"{_LOADER}._dataloader"),
    Attribute(f"{_LOADER}._num_iter_calls", settable=True),
    Refers(
        f"{_LOADER}.__iter__",
        "_set_sampler_epoch",
        "_num_iter_calls",
        "_dataloader",
        "move_data_to_device",
    ),
    Refers("lightning_fabric.utilities.data:_set_sampler_epoch", "sampler", "batch_sampler"),
    # setup.py: the data-parallel processes Fabric shares data among, and its own set-up.
    Attribute(f"{_FABRIC}.strategy"),
    Attribute(f"{_FABRIC}.world_size"),
    Attribute("lightning_fabric.strategies.ddp:DDPStrategy.distributed_sampler_kwargs"),
    Refers(f"{_FABRIC}._requires_distributed_sampler", "distributed_sampler_kwargs"),
    Function(f"{_FABRIC}.broadcast", positional=1, keywords=("src",)),
    Function(
        f"{_FABRIC}.setup_dataloaders",
        positional=1,
        keywords=("use_distributed_sampler", "move_to_device"),
    ),
    # objects.py: the precision plugin's GradScaler, reached from Fabric and its wrappers.
    Name(_MODULE),
    Name(f"{_WRAPPERS}:_FabricOptimizer"),
    Attribute(f"{_MODULE}._strategy"),
    Attribute(f"{_WRAPPERS}:_FabricOptimizer._strategy"),
    Attribute("lightning_fabric.strategies.strategy:Strategy.precision"),
    Attribute("lightning_fabric.plugins.precision.amp:MixedPrecision.scaler"),
    # _module_names.py: a _FabricModule's parameters live under these two names, and its
    # state_dict() is the wrapped model's own.
    Attribute(f"{_MODULE}._forward_module"),
    Attribute(f"{_MODULE}._original_module"),
    Refers(f"{_MODULE}.state_dict", "_original_module"),
    Refers(f"{_MODULE}.load_state_dict", "_original_module"),
)

check_release(FABRIC, adapter="fabric", extra="lightning", internals=INTERNALS)

from .loaders import loader_epoch  # noqa: E402  (registers the loader view)
from .objects import resume_objects  # noqa: E402  (registers the GradScaler check)
from .setup import setup_dataloaders  # noqa: E402

# The names docs/fabric.md documents.
__all__ = [
    "INTERNALS",
    "RELEASES",
    "loader_epoch",
    "resume_objects",
    "setup_dataloaders",
]
