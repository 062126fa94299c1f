// The floor webhook (hack/floor.py): the cheapest validating admission webhook, standard library
// only, against which bench/admission.py measures tally's cost. No requirements: a build needs no
// module proxy.
module tally.dev/hack/floor

go 1.26.0
