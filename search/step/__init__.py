"""A step of phases shared by every workload: live moments -> fragments -> Prediction."""
