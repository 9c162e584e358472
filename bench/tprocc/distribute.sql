-- Tessera only: every table by its warehouse column, all in one co-location
-- group, so a warehouse's rows of every table sit on one node; item is
-- read by every transaction and written by none, so a reference table.
SELECT create_distributed_table('warehouse', 'w_id', shard_count => :shards);
SELECT create_distributed_table('district', 'd_w_id', colocate_with => 'warehouse');
SELECT create_distributed_table('customer', 'c_w_id', colocate_with => 'warehouse');
SELECT create_distributed_table('history', 'h_w_id', colocate_with => 'warehouse');
SELECT create_distributed_table('orders', 'o_w_id', colocate_with => 'warehouse');
SELECT create_distributed_table('new_order', 'no_w_id', colocate_with => 'warehouse');
SELECT create_distributed_table('order_line', 'ol_w_id', colocate_with => 'warehouse');
SELECT create_distributed_table('stock', 's_w_id', colocate_with => 'warehouse');
SELECT create_reference_table('item');
