"""The torch-free contract: config, the cost model, model shapes, step-time and storage specs."""
