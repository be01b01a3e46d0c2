"""What runs inside Spark tasks: fused stages through Beam's bundle processor, grouping."""
