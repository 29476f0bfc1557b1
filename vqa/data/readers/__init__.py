"""The readers of data set formats made elsewhere: a folder's official files (VQA v2 / OK-VQA, COCO captions,
Karpathy's split file, TextVQA, VizWiz, GQA) and the project's JSONL, found and read through one table
(`formats.FORMATS`), and shards (webdataset tars, parquet: `shards`). Each turns its files into the columnar
records of `vqa.data.records`."""
