"""The variables every jets dataset has (ParT's inputs from JetClass branches) and the
assembly of a config's own on top; no array library imported, so the config check at the dry
run can parse and check every expression cheaply."""

from __future__ import annotations

from voxjet.jets.expressions import Variables

# ParT's inputs (Qu, Li, Qian 2022) from JetClass branches, as expressions (see
# voxjet.jets.expressions); a config's `new_variables` add to and override these.
BUILTIN_VARIABLES: dict[str, str] = {
    "part_pt": "hypot(part_px, part_py)",
    "part_pt_log": "log(part_pt)",
    "part_e_log": "log(part_energy)",
    "part_logptrel": "log(part_pt / jet_pt)",
    "part_logerel": "log(part_energy / jet_energy)",
    "part_deltaR": "hypot(part_deta, part_dphi)",
    "part_d0": "tanh(part_d0val)",
    "part_dz": "tanh(part_dzval)",
    "jet_tau21": "jet_tau2 / maximum(jet_tau1, 1e-8)",
    "jet_tau32": "jet_tau3 / maximum(jet_tau2, 1e-8)",
}


def variables(
    new_variables: dict[str, str] | None = None,
    selection: str | None = None,
    test_selection: str | None = None,
) -> Variables:
    """The built-in variables, the config's new ones on top, and the selection and the test
    split's own selection (weaver's test_time_selection), if any."""
    defs = {**BUILTIN_VARIABLES, **(new_variables or {})}
    if selection:
        defs[SELECTION] = selection
    if test_selection:
        defs[TEST_SELECTION] = test_selection
    return Variables(defs, keys={SELECTION: "jets.selection",
                                 TEST_SELECTION: "jets.test_time_selection"})  # fmt: skip


SELECTION = "__selection__"
TEST_SELECTION = "__test_time_selection__"
