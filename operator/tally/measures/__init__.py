"""ClusterQuota measures: custom quota resources computed by CEL expressions over objects.

A measure (``spec.measures[]`` of a ClusterQuota) names a quota resource, the objects it
measures (group and resource), a CEL ``expression`` over ``object`` giving what one object uses
(a number or a quantity) and an optional CEL ``when`` filter. This package owns the pure core:
checking and compiling a measure spec (``measure``), Kubernetes' CEL quantity functions over
tally's exact quantities (``library``), the one CEL environment and the calls into the runtime
(``environment``), and what an expression reads and how its cost grows (``analysis``), which
keep evaluation fast and bounded. It does not own where specs come from, summing a measure over
objects, or how a failed evaluation is reported (a denial, a status condition): its callers do.

The CEL runtime is cel-expr-python, the CEL project's Python binding of cel-cpp, chosen over
cel-python (pure Python: ~250-500 µs for a one-field expression plus ~250 µs to convert a pod,
no evaluation limit) and common-expression-language (Rust: no evaluation limit at all, a nested
comprehension over 1 000 items ran for minutes, and eager conversion of every string): it is
the fastest of the three on Kubernetes objects, has cel-cpp's type checker (a wrong overload
is refused when the measure is written) and stops any evaluation at its 10 000th comprehension
iteration. None of the three carries a custom Python type through CEL, hence the map that
stands for a quantity (:mod:`tally.measures.library`).

This module re-exports the names other layers use.
"""

from tally.measures.measure import (
    MAX_COST,
    MAX_DEPTH,
    MAX_EXPRESSION_LENGTH,
    Measure,
    MeasureCostError,
    MeasureError,
    MeasureEvaluationError,
    compile_measure,
    evaluate,
    validate_measures,
)

__all__ = [
    "MAX_COST",
    "MAX_DEPTH",
    "MAX_EXPRESSION_LENGTH",
    "Measure",
    "MeasureCostError",
    "MeasureError",
    "MeasureEvaluationError",
    "compile_measure",
    "evaluate",
    "validate_measures",
]
