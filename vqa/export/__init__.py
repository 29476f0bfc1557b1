"""vqa.export.onnx."""
