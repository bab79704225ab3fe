"""`speclock doctor`: static self-checks of an engine environment, no GPU needed (see runner.DESCRIPTION).

One module per check family (versions, engine_import, pruned, import_traps, patches, eagle3, aux_layers, archs,
torch_archs, flashinfer_kernels, triton_build, jit_needs, kernels, weights, model_identity),
each a DoctorCheck (context.py); runner.py orders them, asks the engine once and reports.
"""

from speclock.verify.doctor.archs import check_cuda, check_gpu_archs
from speclock.verify.doctor.aux_layers import check_aux_layers
from speclock.verify.doctor.context import (
    Check,
    Context,
    DoctorCheck,
    DoctorOptions,
    build_context,
    load_manifest,
    resolve_python,
    target_facts,
)
from speclock.verify.doctor.eagle3 import check_eagle3
from speclock.verify.doctor.engine_import import check_import
from speclock.verify.doctor.flashinfer_kernels import check_flashinfer_kernels
from speclock.verify.doctor.import_traps import check_import_traps
from speclock.verify.doctor.kernels import check_kernels, kernels_dir
from speclock.verify.doctor.patches import check_patches
from speclock.verify.doctor.pruned import check_pruned
from speclock.verify.doctor.runner import (
    CHECKS,
    DOCTOR_CHECKS,
    DOCTOR_SCHEMA,
    ENGINE_CHECKS,
    add_commands,
    doctor_main,
    exit_code_of,
    run_doctor,
)
from speclock.verify.doctor.torch_archs import check_torch_archs
from speclock.verify.doctor.triton_build import check_triton_build
from speclock.verify.doctor.versions import check_lock

__all__ = [
    "add_commands",
    "build_context",
    "Check",
    "check_aux_layers",
    "check_cuda",
    "check_eagle3",
    "check_gpu_archs",
    "check_flashinfer_kernels",
    "check_import",
    "check_import_traps",
    "check_pruned",
    "check_torch_archs",
    "check_triton_build",
    "check_kernels",
    "check_lock",
    "check_patches",
    "CHECKS",
    "Context",
    "DOCTOR_CHECKS",
    "DOCTOR_SCHEMA",
    "doctor_main",
    "DoctorCheck",
    "DoctorOptions",
    "ENGINE_CHECKS",
    "exit_code_of",
    "kernels_dir",
    "load_manifest",
    "resolve_python",
    "run_doctor",
    "target_facts",
]
