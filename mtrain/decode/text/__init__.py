"""The commands' text (the top layer of `mtrain.decode`): files and streams in and out.

- `textio.py`: raw text in and out (lines, undecodable bytes, n-best TSV);
- `stream.py`: `mtrain translate`, a file or stdin to a file or stdout, through the pipeline;
- `progress.py`: a long decode's progress; `attention_plot.py`: cross-attention heat maps.
"""
