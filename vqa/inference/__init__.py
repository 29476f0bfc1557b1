"""vqa.inference."""
