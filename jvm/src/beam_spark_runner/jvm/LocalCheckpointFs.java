/*
 * LocalCheckpointFileSystem for Hadoop's FileContext API, which Spark's default checkpoint
 * file manager writes through (the runner selects the one over the FileSystem API for local
 * checkpoints, unless the session names its own manager).
 */
package beam_spark_runner.jvm;

import java.io.IOException;
import java.net.URI;
import java.net.URISyntaxException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.DelegateToFileSystem;

public class LocalCheckpointFs extends DelegateToFileSystem {
  public LocalCheckpointFs(URI uri, Configuration conf) throws IOException, URISyntaxException {
    super(uri, new LocalCheckpointFileSystem(), conf, LocalCheckpointFileSystem.SCHEME, false);
  }
}
