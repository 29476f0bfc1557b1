"""vqa.decoding."""
