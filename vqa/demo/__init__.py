"""vqa.demo."""
