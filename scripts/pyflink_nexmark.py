#!/usr/bin/env python3
"""Nexmark queries in PyFlink on a highwater JSON Lines file, for the
side-by-side in BENCHMARKS.md ("Decoding JSON").

Each run is one streaming job (Flink's filesystem source, its JSON format,
a blackhole sink) on a local mini-cluster; the figure is the number of
events over the job's net run time (JobExecutionResult.getNetRuntime, so
the start of the JVM and of the cluster are not counted).

    python3 -m venv venv && venv/bin/pip install apache-flink==2.2.0
    venv/bin/python scripts/pyflink_nexmark.py FILE --events 5000000 \
        --parallelism 1,2 --queries q0,q1,q2,q5,q7,q8,q11 --runs 3

The queries are Flink's Nexmark SQL (github.com/nexmark/nexmark) on the
format highwater writes (`event_type` and one nested record per line,
times as epoch milliseconds, a watermark 4 s behind the largest time seen).
Prints one Markdown row per query and parallelism: the median and each run.
"""

import argparse
import statistics

from pyflink.table import EnvironmentSettings, TableDescriptor, TableEnvironment

SOURCE = """
CREATE TABLE events (
  event_type INT,
  person ROW<id BIGINT, name STRING, emailAddress STRING, creditCard STRING, city STRING,
             state STRING, `dateTime` BIGINT, extra STRING>,
  auction ROW<id BIGINT, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT,
              `dateTime` BIGINT, expires BIGINT, seller BIGINT, category BIGINT, extra STRING>,
  bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel STRING, url STRING, `dateTime` BIGINT,
          extra STRING>,
  `dateTime` AS TO_TIMESTAMP_LTZ(CASE WHEN event_type = 0 THEN person.`dateTime`
                                    WHEN event_type = 1 THEN auction.`dateTime`
                                    ELSE bid.`dateTime` END, 3),
  WATERMARK FOR `dateTime` AS `dateTime` - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = '{path}', 'format' = 'json')
"""

VIEWS = [
    """CREATE VIEW person AS SELECT person.id, person.name, person.emailAddress, person.creditCard,
         person.city, person.state, `dateTime`, person.extra FROM events WHERE event_type = 0""",
    """CREATE VIEW auction AS SELECT auction.id, auction.itemName, auction.description, auction.initialBid,
         auction.reserve, `dateTime`, auction.expires, auction.seller, auction.category, auction.extra
         FROM events WHERE event_type = 1""",
    """CREATE VIEW bid AS SELECT bid.auction, bid.bidder, bid.price, bid.channel, bid.url, `dateTime`,
         bid.extra FROM events WHERE event_type = 2""",
]

QUERIES = {
    "q0": "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
    "q1": "SELECT auction, bidder, 0.908 * price AS price, `dateTime`, extra FROM bid",
    "q2": "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0",
    "q5": """
SELECT AuctionBids.auction, AuctionBids.num
FROM (
  SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
  FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
  GROUP BY auction, window_start, window_end
) AS AuctionBids
JOIN (
  SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
  FROM (
    SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
    FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
    GROUP BY auction, window_start, window_end
  ) AS CountBids
  GROUP BY CountBids.starttime, CountBids.endtime
) AS MaxBids
ON AuctionBids.starttime = MaxBids.starttime AND AuctionBids.endtime = MaxBids.endtime
   AND AuctionBids.num >= MaxBids.maxn""",
    "q7": """
SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
FROM bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end AS `dateTime`
  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.`dateTime` - INTERVAL '10' SECOND AND B1.`dateTime`""",
    "q8": """
SELECT P.id, P.name, P.starttime
FROM (
  SELECT id, name, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY id, name, window_start, window_end
) P
JOIN (
  SELECT seller, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
    "q11": """
SELECT B.bidder, count(*) AS bid_count,
       SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) AS starttime,
       SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) AS endtime
FROM bid B
GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)""",
}


def run(path, query, parallelism):
    """One job: the query on the file into a blackhole; its net run time in seconds."""
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    env.get_config().set("parallelism.default", str(parallelism))
    env.execute_sql(SOURCE.format(path=path))
    for view in VIEWS:
        env.execute_sql(view)
    result = env.sql_query(QUERIES[query]).execute_insert(TableDescriptor.for_connector("blackhole").build())
    result.wait()
    job = result.get_job_client().get_job_execution_result().result()
    return job.get_net_runtime() / 1000.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--events", type=int, required=True, help="events in the file")
    parser.add_argument("--parallelism", default="1,2")
    parser.add_argument("--queries", default="q0,q1,q2,q5,q7,q8,q11")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print("| query | parallelism | median events/s | runs |")
    print("|---|---:|---:|---|")
    for query in args.queries.split(","):
        for parallelism in [int(p) for p in args.parallelism.split(",")]:
            rates = [args.events / run(args.file, query, parallelism) for _ in range(args.runs)]
            runs = ", ".join(f"{r / 1e3:.0f} k" for r in rates)
            print(f"| {query} | {parallelism} | {statistics.median(rates) / 1e3:.0f} k | {runs} |", flush=True)


if __name__ == "__main__":
    main()
