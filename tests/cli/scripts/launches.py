"""A plain Python script that launches 2 fork ranks itself: no kernel, no IPython."""

from nbtrain import notebook_launcher


def rank_of() -> int:
    import os

    return int(os.environ["RANK"])


if __name__ == "__main__":
    print("results", notebook_launcher(rank_of, num_processes=2, start_method="fork",
                                       return_all=True))
