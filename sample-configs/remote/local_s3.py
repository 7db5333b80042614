"""Start moto's S3 server on 127.0.0.1:5055 with a "reports" bucket, for sample-configs/s3.yaml. Ctrl-C stops it."""

import time

import boto3
from moto.server import ThreadedMotoServer

server = ThreadedMotoServer(ip_address="127.0.0.1", port=5055)
server.start()
s3 = boto3.client("s3", endpoint_url="http://127.0.0.1:5055", aws_access_key_id="testing",
                  aws_secret_access_key="testing", region_name="us-east-1")
s3.create_bucket(Bucket="reports")
for quarter in ("q1", "q2", "q3"):
    s3.put_object(Bucket="reports", Key=f"latest/2026/{quarter}.md", Body=f"# Report 2026 {quarter}\n".encode())
s3.put_object(Bucket="reports", Key="latest/summary.json", Body=b'{"quarters": 3}')
print("S3 on http://127.0.0.1:5055, bucket 'reports' (Ctrl-C to stop)")
try:
    while True:
        time.sleep(3600)
except KeyboardInterrupt:
    server.stop()
