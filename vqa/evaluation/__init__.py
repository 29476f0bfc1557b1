"""vqa.evaluation."""
