"""Communication: one collective interface over horovod, torch_gloo and Spark, and gradient compression."""
