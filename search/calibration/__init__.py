"""Calibration: fit the cost model's named coefficients to what probes measured on one device.

- :mod:`search.calibration.parameters`: which coefficients a calibration may move, their bounds, and how a
  calibration's values are applied to a job's hardware and coefficients.
- :mod:`search.calibration.observations`: one probe as the fit sees it (the job it ran and what it measured)
  and the same quantities predicted under given values.
- :mod:`search.calibration.solver`: bounded Levenberg-Marquardt on log relative errors, with a weak pull
  towards the defaults (a coefficient the probes do not determine stays where the literature put it).
- :mod:`search.calibration.fit`: the fit over a set of observations, and its errors before, after and held
  out (leave-one-out).
"""

from search.calibration.fit import CalibrationFit, HeldOut, QuantityErrors, calibrate
from search.calibration.observations import Observation, predicted_quantities
from search.calibration.parameters import (
    CALIBRATION_VERSION,
    PARAMETERS,
    Parameter,
    apply_values,
    default_values,
)

__all__ = [
    "CALIBRATION_VERSION",
    "PARAMETERS",
    "CalibrationFit",
    "HeldOut",
    "Observation",
    "Parameter",
    "QuantityErrors",
    "apply_values",
    "calibrate",
    "default_values",
    "predicted_quantities",
]
